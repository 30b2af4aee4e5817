# help_to_man.awk - one manual page (roff, man(7) macros) from the text that "PROGRAM --help"
# or "PROGRAM COMMAND --help" prints (tools/common/args.c's cli_print_help and main.c's
# usage). Variables: title (the page's name, "iha-forward"), summary (NAME's one line),
# version, date, see_also (comma-separated pages), docs (where the documents that the help
# cites as doc/NAME.md are installed).
# The help's parts map to sections: "usage:" lines to SYNOPSIS, the paragraphs after it to
# DESCRIPTION (a paragraph opening "Exit status:" to EXIT STATUS), and each "word:" heading
# ("options:", "commands:") to a section of that name with one tagged paragraph per entry.
function esc(s) {
    gsub(/\\/, "\\e", s)
    gsub(/-/, "\\-", s)
    return s
}
function line(s) {
    s = esc(s)
    if (s ~ /^[.']/) s = "\\&" s
    print s
}
function section(s) { print ".SH " toupper(s) }
BEGIN {
    printf ".TH %s 1 \"%s\" \"iha %s\" \"User Commands\"\n", toupper(esc(title)), date, version
    section("name")
    print esc(title) " \\- " esc(summary)
    part = "start"
}
/doc\/[a-z_]+\.md/ { cites = 1 }
/^usage: / || (part == "synopsis" && /^       [^ ]/) {
    if (part != "synopsis") section("synopsis")
    else print ".br"
    text = $0
    sub(/^(usage:)? +/, "", text)
    line(text)
    part = "synopsis"
    next
}
/^$/ {
    if (part == "description" || part == "exit") pending = 1
    next
}
/^[a-z][a-z ]*:$/ {
    heading = $0
    sub(/:$/, "", heading)
    section(heading)
    part = "list"
    next
}
part == "list" && /^  [^ ]/ {
    entry = $0
    sub(/^  /, "", entry)
    # An option's value name is one word in capitals (or <...>, [...]) after it.
    if (match(entry, /^--[a-z0-9-]+( [A-Z<[][^ ]*)?/) || match(entry, /^[a-z][a-z0-9-]*/)) {
        tag = substr(entry, 1, RLENGTH)
        rest = substr(entry, RLENGTH + 1)
        sub(/^ +/, "", rest)
        print ".TP"
        if (tag ~ /^--/) {
            split(tag, words, " ")
            print "\\fB" esc(words[1]) "\\fR" (words[2] == "" ? "" : " \\fI" esc(words[2]) "\\fR")
        } else {
            print "\\fB" esc(tag) "\\fR"
        }
        if (rest != "") line(rest)
        next
    }
}
part == "list" && /^   / {
    text = $0
    sub(/^ +/, "", text)
    line(text)
    next
}
{
    if (part == "synopsis" || part == "start") {
        section("description")
        part = "description"
    } else if (part == "list") {
        # Text after a list, without a heading of its own ("Run 'iha <command> --help' ...").
        section("notes")
        part = "description"
    } else if (pending) {
        print ".PP"
    }
    pending = 0
    if ($0 ~ /^Exit status:/ && part != "exit") {
        section("exit status")
        part = "exit"
    }
    line($0)
}
END {
    n = split(see_also, pages, ",")
    if (n > 0) {
        section("see also")
        for (i = 1; i <= n; i++) {
            page = pages[i]
            sub(/\(1\)$/, "", page)
            printf "\\fB%s\\fR(1)%s\n", esc(page), i < n ? "," : ""
        }
        if (cites && docs != "") {
            print ".PP"
            line("The documents the help names as doc/NAME.md are installed in " docs ".")
        }
    }
}
