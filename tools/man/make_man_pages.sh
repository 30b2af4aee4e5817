#!/bin/sh
# make_man_pages.sh PROGRAM VERSION OUTDIR DOCDIR: the manual pages of an iha command, made at
# build time from its own help (help_to_man.awk): PROGRAM(1) from "PROGRAM --help", and one
# page PROGRAM-COMMAND(1) per command its "commands:" list names, from "PROGRAM COMMAND
# --help"; each gzipped as Debian installs them. DOCDIR is where the documents the help cites
# are installed. The date is SOURCE_DATE_EPOCH's when set, so that a rebuild is identical.
set -eu
program=$1 version=$2 out=$3 docs=$4
name=$(basename "$program")
awk=$(dirname "$0")/help_to_man.awk
date=$(date -u ${SOURCE_DATE_EPOCH:+-d "@$SOURCE_DATE_EPOCH"} +%Y-%m-%d)
mkdir -p "$out"
rm -f "$out"/*.1 "$out"/*.1.gz
top=$("$program" --help)
commands=$(printf '%s\n' "$top" | awk '/^[a-z][a-z ]*:$/ { list = ($0 == "commands:") } list && /^  [a-z]/ { print $1 }')
summary=$(printf '%s\n' "$top" | awk 'NR > 1 && /^[A-Z]/ { sub(/ \(.*/, ""); sub(/\.$/, ""); print; exit }')
pages=""
for c in $commands; do pages="$pages,$name-$c"; done
page() { # page TITLE SUMMARY SEE_ALSO: the help text on standard input into TITLE.1.gz
  awk -v title="$1" -v summary="$2" -v see_also="$3" -v version="$version" -v date="$date" \
      -v docs="$docs" -f "$awk" > "$out/$1.1"
  gzip -9nf "$out/$1.1"
}
printf '%s\n' "$top" | page "$name" "$summary" "${pages#,}"
for c in $commands; do
  line=$(printf '%s\n' "$top" | awk -v c="$c" '$1 == c { $1 = ""; sub(/^ +/, ""); print; exit }')
  "$program" "$c" --help | page "$name-$c" "$line" "$name"
done
