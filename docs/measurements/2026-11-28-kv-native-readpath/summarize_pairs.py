import sys, re, statistics
# natsum.py LOG A B: per pair B/A ratios for readrandom and ycsb-c from lines "nat-<bin>-<i> ... readrandom X ycsb-c Y"
log, a, b = sys.argv[1:4]
vals = {}
for line in open(log):
    m = re.match(r'\S+?-(\w+)-(\d+) \S+ load (\S+) readrandom (\d+) ycsb-c (\d+)', line)
    if m:
        vals[(m.group(1), int(m.group(2)))] = (int(m.group(4)), int(m.group(5)))
pairs = sorted({i for (_, i) in vals})
for wi, w in enumerate(['readrandom', 'ycsb-c']):
    ra = [vals[(b, i)][wi] / vals[(a, i)][wi] for i in pairs if (a, i) in vals and (b, i) in vals]
    av = [vals[(a, i)][wi] for i in pairs if (a, i) in vals]
    bv = [vals[(b, i)][wi] for i in pairs if (b, i) in vals]
    print(f'{w:10s} {a} {statistics.median(av):.0f} [{min(av)}-{max(av)}]  {b} {statistics.median(bv):.0f} [{min(bv)}-{max(bv)}]  {b}/{a} per pair median {statistics.median(ra):.2f} [{min(ra):.2f}-{max(ra):.2f}] (n={len(ra)})')
