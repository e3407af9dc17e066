# Corpus locations. mini is synthesized here by stage 1 (no download needed).
MINI=${MINI:-$PWD/data/corpus}
