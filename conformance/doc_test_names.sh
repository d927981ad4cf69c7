#!/bin/sh
# Every ctest that docs/conformance.md names (`conformance_...` in
# backquotes) is registered by an add_test(NAME ...) of the source tree, so
# a reader who runs `ctest -R <name>` finds it.
#   doc_test_names.sh SOURCE_DIR
set -u
source_dir=$1
registered=$(grep -rhoE --include=CMakeLists.txt 'add_test\(NAME [A-Za-z0-9_]+' \
  "$source_dir" | sed 's/^add_test(NAME //' | sort -u)
status=0
for name in $(grep -oE '`conformance_[^`]*`' "$source_dir/docs/conformance.md" | tr -d '`' | sort -u); do
  if ! printf '%s\n' "$registered" | grep -qxF -- "$name"; then
    echo "docs/conformance.md names the ctest $name, which no add_test registers"
    status=1
  fi
done
exit $status
