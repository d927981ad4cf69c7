#!/usr/bin/env bash
# The plugin trust model seen from the devalloc program (docs/security.md),
# one case per ctest entry:
#   trust_test.sh CASE DEVALLOC SCRATCH
set -euo pipefail
case_name=$1 devalloc=$2 scratch=$3
# The plugin folder from the program's, and as messages name it (ctest sets
# both from the install layout).
: "${PLUGIN_DIR_FROM_BIN:=../lib/devalloc/plugins}" "${PLUGIN_DIR_HINT:=PREFIX/lib/devalloc/plugins}"
rm -rf "$scratch" && mkdir -p "$scratch" && cd "$scratch"
host_plugin="$(dirname "$devalloc")/$PLUGIN_DIR_FROM_BIN/libdevalloc_host.so"

fail() { echo "FAIL: $*" >&2; exit 1; }

# A folder anyone may write to, holding a copy of the host plugin as "mine".
mkdir -p open
cp "$host_plugin" open/libdevalloc_mine.so
chmod 0777 open

case "$case_name" in
plugins_lists_untrusted_without_opening)
  # LD_DEBUG=files logs every object the dynamic linker opens.
  LD_DEBUG=files "$devalloc" plugins --plugin-path open > out.txt 2> ld.txt
  cat out.txt
  grep -q "^  $PWD/open (--plugin-path)" out.txt || fail "search path does not say where the folder came from"
  grep -A2 '^mine ' out.txt | grep -q 'untrusted' || fail "mine not listed as untrusted"
  grep -A2 '^mine ' out.txt | grep -q "folder $PWD/open is world-writable (mode 0777)" || fail "no reason for mine"
  ! grep -q 'open/libdevalloc_mine.so' ld.txt || fail "the refused plugin was opened"
  "$devalloc" plugins --plugin-path open --trust-plugin-path open > out.txt
  cat out.txt
  grep -q '^mine  *loaded' out.txt || fail "a trusted path is not loaded"
  ;;
load_refuses_config_library_in_writable_folder)
  printf '{"format": "devalloc-plan", "version": 1, "buffers": [{"memory_id": 0, "device": "mine:0", "size": 64, "alignment": 64}], "tensors": [], "methods": [{"name": "forward", "memory_ids": [0], "tensors": []}]}' > plan.json
  printf '[plugins.mine]\nlibrary = "open/libdevalloc_mine.so"\n' > refused.toml
  set +e; "$devalloc" load plan.json --config refused.toml > out.txt 2> err.txt; rc=$?; set -e
  cat err.txt
  [ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
  grep -q "refused.toml:1:10: \[plugins.mine\]: plugin $PWD/open/libdevalloc_mine.so: refused: folder $PWD/open is world-writable" err.txt \
    || fail "the refusal does not name the config place, the file and the folder"
  grep -qF 'to trust it anyway: --trust-plugin-path, [security] trust_paths or [plugins.NAME] trust = true' err.txt \
    || fail "the refusal does not name the program's way to trust a path"
  # Trusted by the config, or by the command line: the same load works.
  printf 'trust = true\n' >> refused.toml
  "$devalloc" load plan.json --config refused.toml
  printf '[plugins.mine]\nlibrary = "open/libdevalloc_mine.so"\n[security]\ntrust_paths = ["open"]\n' > trusted.toml
  "$devalloc" load plan.json --config trusted.toml
  printf '[plugins.mine]\nlibrary = "open/libdevalloc_mine.so"\n' > plain.toml
  "$devalloc" load plan.json --config plain.toml --trust-plugin-path open
  ;;
installed_folder_is_found_from_the_program_not_argv0)
  # The installed folder is next to the file the kernel runs, whatever
  # argv[0] says: a link elsewhere, a renamed relative link, exec -a.
  installed="$(cd "$(dirname "$(readlink -f "$devalloc")")/$PLUGIN_DIR_FROM_BIN" && pwd -P)"
  check_installed() {
    cat out.txt
    grep -qxF "  $installed (installed)" out.txt || fail "$1: the installed folder is not $installed"
    grep -q '^host  *loaded' out.txt || fail "$1: the host plugin is not found"
  }
  mkdir -p links/bin
  ln -s "$devalloc" links/bin/devalloc
  "$PWD/links/bin/devalloc" plugins > out.txt; check_installed "through an absolute link"
  ln -s "$devalloc" renamed
  ./renamed plugins > out.txt; check_installed "through a renamed relative link"
  (cd links && PATH="$PWD/bin:$PATH" devalloc plugins) > out.txt; check_installed "found on PATH"
  (exec -a /nonexistent/bin/devalloc "$devalloc" plugins) > out.txt; check_installed "with exec -a"
  (exec -a "$PWD/open/devalloc" "$devalloc" plugins) > out.txt; check_installed "with argv[0] in another folder"
  ;;
a_program_outside_the_prefix_is_told_where_plugins_come_from)
  # A copy of the program with no plugin folder next to it, as a
  # program of one's own that links devalloc's libraries: that folder is
  # not searched, and a plugin not found says what to do.
  mkdir -p away/bin && cp "$devalloc" away/bin/devalloc
  away/bin/devalloc plugins > out.txt
  cat out.txt
  ! grep -q '(installed)' out.txt || fail "a folder that does not exist is listed as installed"
  away_plugins=$(realpath -m "$PWD/away/bin/$PLUGIN_DIR_FROM_BIN")
  grep -qF "note: there is no installed plugin folder $away_plugins next to this program; a program outside devalloc's install prefix finds its plugins through the config's plugin_path or DEVALLOC_PLUGIN_PATH ($PLUGIN_DIR_HINT)" out.txt ||
    fail "no note saying where plugins come from"
  printf '{"format": "devalloc-plan", "version": 1, "buffers": [{"memory_id": 0, "device": "host", "size": 64, "alignment": 64}], "tensors": [], "methods": [{"name": "forward", "memory_ids": [0], "tensors": []}]}' > plan.json
  set +e; away/bin/devalloc load plan.json > out.txt 2> err.txt; rc=$?; set -e
  cat err.txt
  [ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
  grep -qF "no libdevalloc_host.so in (empty search path); there is no installed plugin folder $away_plugins" err.txt ||
    fail "the load's error does not say where plugins come from"
  DEVALLOC_PLUGIN_PATH="$(dirname "$host_plugin")" away/bin/devalloc load plan.json
  ;;
broken_plugin_files_are_refused_unopened)
  # A truncated copy (an interrupted cp) made dlopen die of SIGBUS, taking
  # the whole listing with it; another machine's ELF file and a text file
  # get a reason of their own, without a stale errno text after it.
  mkdir -p p && chmod 0755 p
  head -c 5000 "$host_plugin" > p/libdevalloc_trunc.so
  cp "$host_plugin" p/libdevalloc_foreign.so
  if [ "$(uname -m)" = aarch64 ]; then machine='\x3e\x00' name='x86-64 (e_machine 62)'
  else machine='\xb7\x00' name='AArch64 (e_machine 183)'; fi
  printf "$machine" | dd of=p/libdevalloc_foreign.so bs=1 seek=18 conv=notrunc 2>/dev/null
  echo hello > p/libdevalloc_text.so
  chmod 0644 p/*
  set +e; "$devalloc" plugins --plugin-path p > out.txt 2> err.txt; rc=$?; set -e
  cat out.txt err.txt
  [ "$rc" -eq 0 ] || fail "plugins exited $rc, expected 0"
  grep -A2 '^trunc  *cannot be opened' out.txt |
    grep -qE "^  plugin $PWD/p/libdevalloc_trunc.so: cannot be opened: truncated: segment [0-9]+ \(PT_[A-Z_]+\) ends at byte [0-9]+, the file has 5000 bytes$" ||
    fail "the truncated copy is not refused with its reason"
  grep -A2 '^foreign  *cannot be opened' out.txt | grep -qF "cannot be opened: an ELF file for $name, this is " ||
    fail "the foreign file is not refused naming its machine"
  grep -A2 '^text  *cannot be opened' out.txt | grep -q 'cannot be opened: not an ELF file$' ||
    fail "the text file is not refused as not an ELF file"
  grep -q '^host  *loaded' out.txt || fail "the installed host plugin is not listed after them"
  ! grep -A2 -E '^(trunc|foreign|text) ' out.txt | grep -q 'Bad file descriptor\|No such file or directory' ||
    fail "a stale errno text in a reason"
  printf '{"format": "devalloc-plan", "version": 1, "buffers": [{"memory_id": 0, "device": "trunc:0", "size": 64, "alignment": 64}], "tensors": [], "methods": [{"name": "forward", "memory_ids": [0], "tensors": []}]}' > plan.json
  printf '[plugins.trunc]\nlibrary = "p/libdevalloc_trunc.so"\n' > trunc.toml
  set +e; "$devalloc" load plan.json --config trunc.toml > out.txt 2> err.txt; rc=$?; set -e
  cat err.txt
  [ "$rc" -eq 1 ] || fail "load exited $rc, expected 1"
  grep -q "plugin $PWD/p/libdevalloc_trunc.so: cannot be opened: truncated: segment" err.txt ||
    fail "load does not say why the plugin cannot be opened"
  ;;
untrusted_names_are_printed_escaped)
  # Names planted by someone else go into the refusal and the search path
  # lines: escaped, so they cannot drive the terminal.
  mkdir -p sticky && chmod 1777 sticky
  esc=$'\x1b[2J\x1b]0;pwned\x07'
  cp "$host_plugin" "sticky/libdevalloc_a$esc.so" && chmod 0666 "sticky/libdevalloc_a$esc.so"
  mkdir -p "dir"$'\x1b[31m'
  "$devalloc" plugins --plugin-path sticky --plugin-path "dir"$'\x1b[31m' > out.txt
  cat -v out.txt
  ! grep -q $'[\x1b\x07]' out.txt || fail "a raw escape reached the output"
  grep -qF "  $PWD/dir\x1b[31m (--plugin-path)" out.txt || fail "the search path line is not escaped"
  grep -qF "refused: file $PWD/sticky/libdevalloc_a\x1b[2J\x1b]0;pwned\x07.so is world-writable (mode 0666)" out.txt ||
    fail "the refusal does not show the file name escaped"
  ;;
links_on_the_plugin_path_are_checked_where_they_lie)
  # A link named like a plugin leads to a safe copy of the host plugin: in
  # a world-writable folder it is refused for that folder (whoever planted
  # it chose the library), in a folder of our own it loads and is listed
  # with the file it led to.
  mkdir -p safe mine && chmod 0755 safe mine
  cp "$host_plugin" safe/libdevalloc_target.so && chmod 0644 safe/libdevalloc_target.so
  real=$(realpath safe/libdevalloc_target.so)
  ln -s "$real" open/libdevalloc_planted.so
  LD_DEBUG=files "$devalloc" plugins --plugin-path open > out.txt 2> ld.txt
  cat out.txt
  grep -A2 '^planted ' out.txt | grep -q 'untrusted' || fail "the planted link is not listed as untrusted"
  grep -A2 '^planted ' out.txt | grep -qF "plugin $PWD/open/libdevalloc_planted.so: refused: folder $PWD/open is world-writable (mode 0777)" ||
    fail "the refusal does not name the link's folder"
  ! grep -q 'libdevalloc_target.so' ld.txt || fail "the link's target was opened"
  ln -s "$real" mine/libdevalloc_linked.so
  "$devalloc" plugins --plugin-path mine > out.txt
  cat out.txt
  grep -A1 '^linked  *loaded' out.txt | grep -qxF "  $PWD/mine/libdevalloc_linked.so -> $real" ||
    fail "the loaded link is not shown with the file it led to"
  ;;
a_link_owned_by_another_user_in_a_sticky_folder_is_refused)
  # Anyone may plant a link in a sticky folder; devalloc run by root must
  # not follow one to a library of the planter's choosing, even root's own.
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: needs root to make a link owned by another user (chown -h 65534)"
    exit 77
  fi
  mkdir -p sticky && chmod 1777 sticky
  real=$(realpath "$host_plugin")
  ln -s "$real" sticky/libdevalloc_host.so
  chown -h 65534 sticky/libdevalloc_host.so
  LD_DEBUG=files "$devalloc" plugins --plugin-path sticky > out.txt 2> ld.txt
  cat out.txt
  grep -A2 '^host  *untrusted' out.txt |
    grep -qF "refused: symbolic link $PWD/sticky/libdevalloc_host.so (to $real) is owned by uid 65534, neither root nor the effective user (uid 0)" ||
    fail "the planted link is not refused naming the link, its target and its owner"
  ! grep -q "calling init: $real" ld.txt || fail "the link's target was opened"
  ;;
empty_path_options_are_usage_errors)
  # "" is no folder, no path to trust and no config: a usage error (exit 2)
  # naming the option, never an internal error or a silent default.
  printf '{"format": "devalloc-plan", "version": 1, "buffers": [], "tensors": [], "methods": [{"name": "forward", "memory_ids": [], "tensors": []}]}' > plan.json
  expect_usage() {
    local pattern=$1; shift
    set +e; "$devalloc" "$@" > out.txt 2> err.txt; local rc=$?; set -e
    cat err.txt
    [ "$rc" -eq 2 ] || fail "exit code $rc, expected 2: $*"
    grep -qE "$pattern" err.txt || fail "stderr does not match /$pattern/: $*"
    ! grep -q 'internal error' err.txt || fail "an internal error: $*"
  }
  expect_usage '^--plugin-path: an empty path names no folder' plugins --plugin-path ''
  expect_usage '^--plugin-path: an empty path names no folder' plugins --plugin-path open --plugin-path ''
  for cmd in plugins 'inspect plan.json' 'load plan.json'; do
    # shellcheck disable=SC2086
    expect_usage '^--trust-plugin-path: an empty path names nothing to trust' $cmd --trust-plugin-path ''
    # shellcheck disable=SC2086
    expect_usage '^--config: an empty path names no config' $cmd --config ''
  done
  "$devalloc" load plan.json > /dev/null || fail "the same load without the empty options fails"
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
