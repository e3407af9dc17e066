# Corpus locations (each may be overridden from the environment: TEDLIUM2=/data ./run.sh).
#
# TEDLIUM2: TED-LIUM release 2 (https://www.openslr.org/19/, TEDLIUM_release2.tar.gz unpacked):
#   the TEDLIUM_release2 folder itself or its parent, holding {train,dev,test}/{sph,stm}/.
TEDLIUM2=${TEDLIUM2:-$PWD/downloads}
