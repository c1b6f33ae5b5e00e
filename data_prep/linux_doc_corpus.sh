#!/usr/bin/env bash
# The English prose of Debian's linux-doc-6.1 package (the kernel's documentation sources as its HTML ships them,
# translations/ left out: 2,841 files, 21.4 MB in 6.1.192-3) into OUT (default .corpora/linux-doc): the learning
# benchmark's prose corpus, beside its Python source:
#   bash data_prep/linux_doc_corpus.sh && python scripts/measure_learning.py --roots .corpora/linux-doc \
#       --suffix .rst.txt ...
# Needs apt and the Debian registry (apt-get update once); a GPU machine without network takes the folder carried.
set -euo pipefail
OUT=${1:-.corpora/linux-doc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q linux-doc-6.1 > /dev/null)
deb=$(echo "$work"/linux-doc-6.1_*_all.deb)
dpkg-deb -x "$deb" "$work/x"
rm -rf "$OUT" && mkdir -p "$OUT"
tar -C "$work/x/usr/share/doc/linux-doc-6.1/html/_sources" --exclude=./translations -cf - . | tar -C "$OUT" -xf -
echo "$OUT: linux-doc-6.1 $(dpkg-deb -f "$deb" Version), $(find "$OUT" -name '*.rst.txt' | wc -l) files," \
     "$(find "$OUT" -name '*.rst.txt' -exec cat {} + | wc -c) bytes"
