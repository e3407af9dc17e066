# Corpus locations (each may be overridden from the environment: WSJ=/data/wsj ./run.sh).
#
# WSJ: one folder holding the WSJ0 (LDC93S6B) and WSJ1 (LDC94S13B) disc folders 11-*.1 and 13-*.1,
#   directly or up to 4 levels below it (e.g. csr_1/11-13.1, csr_2_comp/13-34.1); upper- or
#   lower-case file names. If WSJ0 and WSJ1 lie in different places, make a folder with a symlink
#   to each and point WSJ at it.
WSJ=${WSJ:-$PWD/downloads/wsj}
# WSJ_FLAC: where stage 1 caches the decoded .wv1 (SPHERE + Shorten) audio as FLAC, so training
#   reads FLAC instead of decoding Shorten (several GB for si284 + tests). Empty: no cache, the
#   manifests point at the .wv1 files.
WSJ_FLAC=${WSJ_FLAC-$PWD/data/flac}
