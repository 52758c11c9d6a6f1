#!/usr/bin/env bash
# table.sh OUT.md [COMMAND] - the benchmarks' key=value lines as a table.
# Reads the lines `make bench` prints (one `bench=NAME key=value ...` line per
# measurement), passes each through to stdout as it comes, and at the end
# writes OUT.md: a header line naming the CPU model, the compilers, the date
# and the load (/proc/loadavg when the first line came and after the last),
# then one table row per measurement. docs/performance.md explains the table.
#
# A row is a line with a figure: a key whose value has a decimal point, or a
# key that names a rate, time, size or check (images_per_s, ms, _mib, ...).
# Its keys that are not figures say which measurement it is. Lines with no
# figure (the SIMD path, the core count, a peer that is missing) and the
# issue's reference figures (measured_here=0) are listed apart, verbatim.
# The compilers are the ones named in $BENCH_COMPILERS (default: gcc).
set -u
out=${1:?usage: bench/table.sh OUT.md [COMMAND] < key=value lines}
cmd=${2:-make bench}
mkdir -p "$(dirname "$out")" || exit 2
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
lines=$(mktemp) || exit 2
trap 'rm -f "$lines"' EXIT
while IFS= read -r line; do
    printf '%s\n' "$line"
    printf '%s\n' "$line" >>"$lines"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
[ -n "$cpu" ] || cpu=$(uname -m)
compilers=
for cc in ${BENCH_COMPILERS:-gcc}; do
    v=$($cc --version 2>/dev/null | head -n 1) || continue
    [ -n "$v" ] && compilers="${compilers:+$compilers; }$v"
done

{
    printf '# `%s` results\n\n' "$cmd"
    printf 'CPU: %s (%s cores) | compilers: %s | date: %s | load (1, 5, 15 min): %s at the start, %s at the end\n\n' \
        "$cpu" "$(nproc 2>/dev/null || echo '?')" "${compilers:-unknown}" "$(date -u +%Y-%m-%d)" "$load_start" "$load_end"
    awk '
    function figure(k, v) {
        if (k == "loadavg_1m") return 0  # setup: table.sh records the load itself
        return v ~ /^-?[0-9]*\.[0-9]+$/ ||
               k ~ /(_per_s|_per_step|_per_elem|gflops|tflops|_mib|_bytes|fraction)$/ ||
               k == "value" || k == "ms" || k == "check"
    }
    # splits a line into keys and values, keeping quoted values whole
    function parse(line,    n, k) {
        n = 0
        while (match(line, /[A-Za-z0-9_]+=("[^"]*"|[^ ]*)/)) {
            k = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
            keys[++n] = substr(k, 1, index(k, "=") - 1); vals[n] = substr(k, index(k, "=") + 1)
        }
        return n
    }
    !/^bench=/ { next }
    {
        n = parse($0); what = ""; res = ""; name = vals[1]
        for (i = 2; i <= n; i++) {
            if (keys[i] == "measured_here" && vals[i] == "0") { res = ""; break }
            if (figure(keys[i], vals[i])) res = res (res == "" ? "" : " ") keys[i] "=" vals[i]
            else what = what (what == "" ? "" : " ") keys[i] "=" vals[i]
        }
        if (res == "") { notes[++nn] = $0; next }
        gsub(/\|/, "\\|", what); gsub(/\|/, "\\|", res)
        rows[++nr] = "| " name " | " what " | " res " |"
    }
    END {
        print "| benchmark | measurement | figures |"
        print "|---|---|---|"
        for (i = 1; i <= nr; i++) print rows[i]
        if (nn) {
            print "\nThe lines without a figure (setup, missing peers, reference figures not measured here):\n\n```text"
            for (i = 1; i <= nn; i++) print notes[i]
            print "```"
        }
    }' "$lines"
} >"$out.tmp" && mv "$out.tmp" "$out"
echo "bench=table rows=$(grep -c '^| [a-z_]* | ' "$out") out=$out" >&2
