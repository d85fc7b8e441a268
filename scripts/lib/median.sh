# shellcheck shell=bash
# median FILE: the median of the numbers in FILE, one a line (the mean of
# the middle two for an even count), for the benchmark scripts that report
# medians of interleaved rounds (bench-carrier-floor.sh, bench-ddp-accept.sh,
# bench-ddp-splice.sh).
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
