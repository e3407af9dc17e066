# Corpus location (may be overridden from the environment: SPEECHOCEAN762=/data/speechocean762 ./run.sh).
#
# SPEECHOCEAN762: speechocean762 (https://www.openslr.org/101/, speechocean762.tar.gz, CC BY 4.0),
#   unpacked: the folder holding train/, test/, resource/ and WAVE/ (or its parent). Not there?
#   ./run.sh --download true fetches and unpacks it into downloads/ (the default place).
SPEECHOCEAN762=${SPEECHOCEAN762:-$PWD/downloads/speechocean762}
# OpenSLR's URL of the tarball, and its SHA-256 (empty: OpenSLR publishes none; the download then
# records the one it got in downloads/speechocean762.tar.gz.sha256 and checks the unpacked corpus
# against conf/corpus.sha256, the SHA-256 of its transcript and speaker files)
SPEECHOCEAN762_URL=${SPEECHOCEAN762_URL:-https://www.openslr.org/resources/101/speechocean762.tar.gz}
SPEECHOCEAN762_SHA256=${SPEECHOCEAN762_SHA256:-}
