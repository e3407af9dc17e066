# Corpus locations (each may be overridden from the environment: TEDLIUM3=/data ./run.sh).
#
# TEDLIUM3: TED-LIUM release 3 (https://www.openslr.org/51/, TEDLIUM_release-3.tgz unpacked):
#   the TEDLIUM_release-3 folder itself or its parent, holding legacy/{train,dev,test}/{sph,stm}/
#   (the legacy split: v3 training data, dev and test as in releases 1 and 2).
TEDLIUM3=${TEDLIUM3:-$PWD/downloads}
