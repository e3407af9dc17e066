# Corpus locations (each may be overridden from the environment: LIBRISPEECH=/data ./run.sh).
#
# LIBRISPEECH: LibriSpeech (https://www.openslr.org/12/, the *.tar.gz parts unpacked into one
#   place): the LibriSpeech folder itself or its parent, holding <part>/<speaker>/<chapter>/
#   (train-clean-100, train-clean-360, train-other-500, dev-clean, test-clean, test-other, ...).
LIBRISPEECH=${LIBRISPEECH:-$PWD/downloads}
