#!/bin/bash
# Runs inside the emulated host (4 NUMA nodes: DRAM 0 and 1 on two sockets, CPU-less "CXL" nodes
# 2 and 3 that HMAT describes as slower), chrooted into the real host's root over virtfs. Starts
# nested QEMUs (TCG, no OS, RAM preallocated on a CXL node), vtismd, and the harness that plays
# the guests, then checks what the issue asks. Results go to $OUT/results (PASS/FAIL lines) and $OUT/*.log.
set -u
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
OUT=${OUT:-/mnt}
BIN=$REPO/target/release/vtism
H=$REPO/target/release/examples/e2e-harness
W=/tmp/e2e
mkdir -p $W/qmp
: >"$OUT/results"
ip link set lo up 2>/dev/null || busybox ip link set lo up
exec 2>&1

# shellcheck source=tests/lib/checks.sh
. "$REPO/tests/lib/checks.sh"
ctl() { $BIN ctl --socket $W/ctl.sock "$@"; }
status_json() { ctl status --json 2>/dev/null; }
ctl_quota() { vm_field "$1" quota_bytes; }
vm_expr() { # vm_expr VM EXPR: a Python expression over the VM's row `v` of `vtism ctl status --json`
	status_json | python3 -c "import json,sys; d=json.load(sys.stdin); v=[x for x in d['vms'] if x['name']=='$1']; v=v[0] if v else None; print(($2) if v else 'absent')" 2>/dev/null || echo absent
}
vm_field() { # vm_field VM FIELD: a field of a VM in `vtism ctl status --json`
	status_json | python3 -c "import json,sys; d=json.load(sys.stdin); v=[x for x in d['vms'] if x['name']=='$1']; print(v[0]['$2'] if v else 'absent')" 2>/dev/null || echo "absent"
}
agree() { # agree VM EXPR REGEX: "S M", vm_expr VM EXPR and metric REGEX of one moment
	# Both come from the snapshot vtismd publishes each round, read by two requests: a value that
	# changed between them (khugepaged collapsing a block) is read again. S read before and after
	# the scrape is the same, so M is that snapshot's.
	local s1 m s2 i
	for i in 1 2 3 4 5; do
		s1=$(vm_expr "$1" "$2")
		m=$(metric "$3")
		s2=$(vm_expr "$1" "$2")
		[ "$s1" = "$s2" ] && break
		sleep 0.5
	done
	echo "$s1 $m"
}
metric() { # metric REGEX: sum of matching samples (a failed scrape is retried, then reported)
	local out i
	for i in 1 2 3; do
		out=$($H get "$METRICS" /metrics 2>&1) && echo "$out" | grep -q '^vtism_rounds_total' && break
		echo "metric: scrape failed: $(echo "$out" | head -2)" >&2
		sleep 1
	done
	echo "$out" | grep -E "$1" | awk '{s+=$NF} END {print s+0}'
}
wait_for() { # wait_for SECONDS COMMAND...: poll until the command succeeds
	local t=$1
	shift
	local end=$((SECONDS + t))
	while [ $SECONDS -lt $end ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	return 1
}

# start_vm NAME MIB CPU [NODE]: a QEMU with no OS whose RAM is preallocated and bound to NODE
# (default 2), an ivshmem channel, one QMP monitor for vtismd (in the scan directory) and one for
# the harness.
start_vm() {
	local name=$1 mib=$2 cpu=$3 node=${4:-2}
	truncate -s 1M /dev/shm/vtism-$name.chan
	taskset -c "$cpu" qemu-system-x86_64 -accel tcg,tb-size=4 -machine q35 -m ${mib}M,slots=2,maxmem=1G -smp 1 -S \
		-display none -nodefaults -name "$name" \
		-object memory-backend-ram,id=ram0,size=${mib}M,prealloc=on,host-nodes=$node,policy=bind \
		-numa node,nodeid=0,memdev=ram0 \
		-object memory-backend-file,id=vtism-chan,mem-path=/dev/shm/vtism-$name.chan,size=1M,share=on \
		-device ivshmem-plain,memdev=vtism-chan,id=vtism0 \
		-qmp unix:$W/qmp/$name.qmp,server=on,wait=off \
		-qmp unix:$W/$name.harness,server=on,wait=off \
		-qmp unix:$W/$name.sampler,server=on,wait=off \
		-daemonize -pidfile $W/$name.pid
}

# start_bare_vm NAME MIB CPU NODE [QEMU ARGS...]: a QEMU with no vtism channel (no tracker can
# publish), RAM preallocated and bound to NODE, monitors as start_vm's.
start_bare_vm() {
	local name=$1 mib=$2 cpu=$3 node=$4
	shift 4
	taskset -c "$cpu" qemu-system-x86_64 -accel tcg,tb-size=4 -machine q35 -m ${mib}M -smp 1 \
		-display none -nodefaults -name "$name" \
		-object memory-backend-ram,id=ram0,size=${mib}M,prealloc=on,host-nodes=$node,policy=bind \
		-numa node,nodeid=0,memdev=ram0 \
		-qmp unix:$W/qmp/$name.qmp,server=on,wait=off \
		-qmp unix:$W/$name.harness,server=on,wait=off \
		-daemonize -pidfile $W/$name.pid "$@"
}

# start_hugetlb_vm NAME SIZE PAGE: start_vm's channel and monitors (no sampler), its RAM (SIZE,
# QEMU's syntax) on hugetlbfs pages of PAGE (memfd, as QEMU's hugetlb=on), preallocated on node 2
# from a pool the caller made.
start_hugetlb_vm() {
	local name=$1 size=$2 page=$3
	truncate -s 1M /dev/shm/vtism-$name.chan
	taskset -c 0 qemu-system-x86_64 -accel tcg,tb-size=4 -machine q35 -m "$size" -smp 1 -S \
		-display none -nodefaults -name "$name" \
		-object memory-backend-memfd,id=ram0,size=$size,hugetlb=on,hugetlbsize=$page,prealloc=on,host-nodes=2,policy=bind \
		-numa node,nodeid=0,memdev=ram0 \
		-object memory-backend-file,id=vtism-chan,mem-path=/dev/shm/vtism-$name.chan,size=1M,share=on \
		-device ivshmem-plain,memdev=vtism-chan,id=vtism0 \
		-qmp unix:$W/qmp/$name.qmp,server=on,wait=off \
		-qmp unix:$W/$name.harness,server=on,wait=off \
		-daemonize -pidfile $W/$name.pid
}

daemon_sections() { # what every daemon configuration here starts with
	cat <<EOF
[daemon]
interval_ms = 300
control_socket = "$W/ctl.sock"
metrics_listen = "127.0.0.1:9464"
log_level = "info,vtism_host=debug"
[discovery]
scan_dirs = ["$W/qmp"]
scan_interval_ms = 500
refresh_interval_ms = 3000
retry_backoff_ms = 1000
[channel]
entry_budget = 32768
max_entries = 65536
min_interval_ms = 200
[mover]
promote_mbps = 0
demote_mbps = 0
# A second of each limit's rate at once (the default is 8 s): the restart check below times
# vm-a's 2 MB/s limit, which an 8 s burst would mostly hide.
burst_s = 1
[host_tracking]
busy_retry_ms = 1000
EOF
}

write_config() { # write_config QUOTA_A_MIB [RATE_A_MBPS]
	{
		daemon_sections
		cat <<EOF
[defaults]
fast_quota_percent = 10
[[vm]]
name = "vm-a"
fast_quota_mib = $1
promote_mbps = ${2:-0}
demote_mbps = ${2:-0}
[[vm]]
name = "vm-b"
fast_quota_mib = 16
[[vm]]
name = "vm-c"
fast_quota_mib = 112
promote_mbps = 6
demote_mbps = 6
[[vm]]
name = "vm-d"
fast_quota_mib = 16
[[vm]]
name = "vm-g"
fast_quota_mib = 16
[[vm]]
name = "vm-s"
fast_quota_mib = 16
[[vm]]
name = "vm-h"
fast_quota_mib = 16
[[vm]]
name = "vm-n"
fast_quota_mib = 16
host_tracking = "off"
EOF
	} >$W/vtismd.toml
}

start_daemon() { # start_daemon [CONFIG]
	RUST_LOG=info,vtism_host=debug $BIN host -c "${1:-$W/vtismd.toml}" >>"$OUT/vtismd.log" 2>&1 &
	echo $! >$W/vtismd.pid
	wait_for 20 ctl status
}

echo "== emulated host: $(uname -r), nodes $(cat /sys/devices/system/node/online), tiers:"
for t in /sys/devices/virtual/memory_tiering/memory_tier*; do echo "   $t: $(cat $t/nodelist)"; done
echo "== topology as vtismd sees it"
$BIN host --print-topology -c /dev/null | python3 -c "import json,sys; [print('   node', n['id'], 'tier', n['tier'], 'cpus', n['cpus'], 'socket', n['socket']) for n in json.load(sys.stdin)['nodes']]"
check "topology: node 2 is a slower tier, nodes 0/1 fast on two sockets" \
	bash -c "$BIN host --print-topology -c /dev/null | python3 -c \"import json,sys; n={x['id']:x for x in json.load(sys.stdin)['nodes']}; assert n[2]['tier']==1 and n[0]['tier']==0 and n[1]['tier']==0 and n[0]['socket']!=n[1]['socket'] and n[2]['cpus']==[], n; print('ok')\""

T0=$SECONDS
start_vm vm-a 128 0
start_vm vm-b 64 0
echo "== nested QEMUs started in $((SECONDS - T0))s"
$H placement $W/vm-a.harness

write_config 32
start_daemon || fail "daemon did not start"
METRICS=127.0.0.1:9464

# Guests: vm-a publishes a 16 MiB hot set; vm-b is hostile from the start.
$H publish /dev/shm/vtism-vm-a.chan 0x1000+4096 200 >"$OUT/publish-a.log" 2>&1 &
PUB_A=$!
# The convergence bound counts guest rounds (200 ms) since the publisher started, so it includes
# the attach: the daemon's plans are done by about round 22 here. Its sampler starts with the
# publisher, beside the discovery check: started after that check, its first placement sample
# came at round 39, and at 47 with the machine's 2 cores loaded by other TCG guests, so the bound
# measured how loaded the machine was rather than when vtismd converged.
$H wait $W/vm-a.harness /dev/shm/vtism-vm-a.chan 0x1000+4096 0 2 32 120 max-round=60 >$W/converge-a.out 2>&1 &
CONVERGE_A=$!
$H hostile /dev/shm/vtism-vm-b.chan 25 16384 >"$OUT/hostile-b.log" 2>&1 &
HOSTILE=$!

check "discovery: both VMs picked up from the scan directory" \
	wait_for 20 bash -c "[ \"\$($BIN ctl --socket $W/ctl.sock status --json | python3 -c \"import json,sys; print(len(json.load(sys.stdin)['vms']))\")\" = 2 ]"

wait $CONVERGE_A
converge_a=$?
check "convergence: vm-a's hinted frames on node 0, the rest on node 2, quota 32 MiB held" \
	bash -c "cat $W/converge-a.out; exit $converge_a"

# A VM that starts later, with its vCPU on socket 1: its hot set goes to node 1.
start_vm vm-d 64 1
$H publish /dev/shm/vtism-vm-d.chan 0x800+2048 200 >"$OUT/publish-d.log" 2>&1 &
PUB_D=$!
check "late VM on socket 1: vm-d picked up, hot frames on node 1 (its home), rest on node 2" \
	$H wait $W/vm-d.harness /dev/shm/vtism-vm-d.chan 0x800+2048 1 2 16 120 max-round=60

# vm-g: guest RAM on 2 MiB hugetlbfs pages (memfd, as QEMU's hugetlb=on), preallocated on node
# 2 from a pool made for it. move_pages moves such a page only whole and, on 6.1, only by its
# head address: vtismd hands each page over once, by its head, and counts the whole page. Its
# 8 MiB hot set is four pages; the quota (16 MiB) holds at every sample.
HP=/sys/devices/system/node/node2/hugepages/hugepages-2048kB/nr_hugepages
echo 40 >$HP
start_hugetlb_vm vm-g 64M 2M || fail "hugetlbfs: vm-g did not start (pool: $(cat $HP) pages on node 2)"
$H publish /dev/shm/vtism-vm-g.chan 0x800+2048 200 >"$OUT/publish-g.log" 2>&1 &
PUB_G=$!
check "hugetlbfs: vm-g's hinted pages on node 0, the rest on node 2, quota 16 MiB held" \
	$H wait $W/vm-g.harness /dev/shm/vtism-vm-g.chan 0x800+2048 0 2 16 120 max-round=60
# One status read for all five: they belong to one moment.
read -r ht hps moved others outc <<<"$(vm_expr vm-g "' '.join(map(str, ((v['backing']['hugetlb_bytes'] >> 20, v['backing']['hugetlb_page_bytes'] >> 10) if v['backing'] else (-1, -1)) + (v['pages_by_outcome'].get('moved', 0), sum(n for o, n in v['pages_by_outcome'].items() if o != 'moved'), sorted(v['pages_by_outcome'].items()))))")"
# 64 MiB less the PC's hole below 1 MiB.
[ "$ht" = 63 ] && [ "$hps" = 2048 ] && [ "${moved:-0}" -ge 2048 ] && [ "$others" = 0 ] &&
	pass "hugetlbfs: ctl status says $ht MiB in 2 MiB pages; move outcomes $outc, nothing failed, busy or left" ||
	fail "hugetlbfs: vm-g backing $ht MiB in $hps KiB pages, outcomes $outc"
check "hugetlbfs: ctl status names vm-g's hugetlbfs pages" bash -c "$BIN ctl --socket $W/ctl.sock status | grep -A4 '^vm-g ' | grep -qE 'backing: hugetlbfs 63\.[0-9]MiB in 2\.0MiB pages'"
kill $PUB_G "$(cat $W/vm-g.pid)"
vm_g_gone() { [ "$(status_json | python3 -c "import json,sys; print(len([v for v in json.load(sys.stdin)['vms'] if v['name'] == 'vm-g']))")" = 0 ]; }
check "hugetlbfs: vm-g dropped when its QEMU exits" wait_for 20 vm_g_gone
wait_for 10 bash -c "! kill -0 $(cat $W/vm-g.pid)"

# vm-j: guest RAM on one 1 GiB hugetlbfs page on node 2. The kernel moves a gigantic page only
# whole and only into a free gigantic page of the target node's pool (mm/hugetlb.c allocates none
# for migration), which no quota here could hold: vtismd leaves it where it is, says so once, and
# hands none of its frames to move_pages however hot the guest says they are.
# The page is reserved at boot (run.sh: hugepagesz=1G hugepages=2:1): at run time no 1 GiB
# range of node 2 was free of unmovable pageblocks, as on most hosts after boot.
GP=/sys/devices/system/node/node2/hugepages/hugepages-1048576kB/nr_hugepages
if [ "$(cat $GP 2>/dev/null)" != 1 ]; then
	fail "hugetlbfs 1 GiB: no gigantic page on node 2 (nr_hugepages $(cat $GP 2>/dev/null || echo absent))"
else
	start_hugetlb_vm vm-j 1G 1G || fail "hugetlbfs 1 GiB: vm-j did not start"
	$H publish /dev/shm/vtism-vm-j.chan 0x800+2048 200 >"$OUT/publish-j.log" 2>&1 &
	PUB_J=$!
	# 30 hint rounds accepted (6 s of the publisher's 200 ms rounds) after the first plan.
	vm_j_rounds() { [ "$(vm_field vm-j rounds_accepted)" -ge "${1:-30}" ] 2>/dev/null; }
	check "hugetlbfs 1 GiB: vm-j picked up and its hints accepted (30 rounds)" wait_for 90 vm_j_rounds 30
	read -r ps_j um_j moved_j fast_j outc_j <<<"$(vm_expr vm-j "' '.join(map(str, ((v['backing']['hugetlb_page_bytes'] >> 20, v['backing']['unmovable_bytes'] >> 20) if v['backing'] else (-1, -1)) + (v['promoted_bytes'] + v['demoted_bytes'], v['fast_bytes'], sorted(v['pages_by_outcome'].items()))))")"
	# 1 GiB less the PC's hole below 1 MiB.
	[ "$ps_j" = 1024 ] && [ "$um_j" -ge 1023 ] 2>/dev/null && [ "$outc_j" = "[]" ] && [ "$moved_j" = 0 ] && [ "$fast_j" = 0 ] &&
		pass "hugetlbfs 1 GiB: ctl status says $um_j MiB not movable in $ps_j MiB pages; nothing handed to move_pages ($outc_j), nothing moved" ||
		fail "hugetlbfs 1 GiB: vm-j page $ps_j MiB, unmovable $um_j MiB, outcomes $outc_j, moved $moved_j bytes, fast $fast_j bytes"
	check "hugetlbfs 1 GiB: ctl status says vm-j's RAM is not moved" bash -c "$BIN ctl --socket $W/ctl.sock status | grep -A4 '^vm-j ' | grep -qE 'not moved \(hugetlbfs pages over 2 MiB\)'"
	um_metric=$($H get "$METRICS" /metrics | grep -E '^vtism_vm_unmovable_bytes\{vm="vm-j"\}' | awk '{print $NF}')
	[ "$um_metric" -ge $((1023 << 20)) ] 2>/dev/null &&
		pass "hugetlbfs 1 GiB: vtism_vm_unmovable_bytes says so: $um_metric" ||
		fail "hugetlbfs 1 GiB: vtism_vm_unmovable_bytes for vm-j is $um_metric"
	# Still nothing tried 30 rounds later, and the log said it once.
	wait_for 60 vm_j_rounds $(($(vm_field vm-j rounds_accepted) + 30))
	outc_j=$(vm_expr vm-j "sorted(v['pages_by_outcome'].items())")
	warned=$(grep -c 'larger than 2 MiB: left where it is.*vm-j' "$OUT/vtismd.log")
	[ "$outc_j" = "[]" ] && [ "$warned" = 1 ] &&
		pass "hugetlbfs 1 GiB: nothing retried: no move in 60 rounds, said once in the log" ||
		fail "hugetlbfs 1 GiB: outcomes $outc_j after 60 rounds, the log said it $warned times"
	kill $PUB_J "$(cat $W/vm-j.pid)"
	wait_for 10 bash -c "! kill -0 $(cat $W/vm-j.pid)"
fi
echo 0 >$GP 2>/dev/null
echo 0 >$HP

# vm-s: RAM on host THPs, its vCPU writing every page of guest-physical 32-62 MiB (so that they
# hold data: Linux 6.12 maps a split THP's zero-filled pages to the shared zero page), a hot set
# of 64 frames at the start of each of those 15 blocks (3.75 MiB in 30 MiB of folios) and a
# 16 MiB quota: whole, the folios holding hot data do not fit, so vtismd splits them (fewer than
# half their frames hot) and places the hot frames alone.
"$REPO/tests/host-e2e/mkpayload.sh" $W/fill.elf 0x2000000 0x3e00000 || fail "split: payload build failed"
truncate -s 1M /dev/shm/vtism-vm-s.chan
taskset -c 0 qemu-system-x86_64 -accel tcg,tb-size=4 -machine q35 -m 64M -smp 1 \
	-display none -nodefaults -name vm-s \
	-object memory-backend-ram,id=ram0,size=64M,prealloc=on,host-nodes=2,policy=bind \
	-numa node,nodeid=0,memdev=ram0 \
	-object memory-backend-file,id=vtism-chan,mem-path=/dev/shm/vtism-vm-s.chan,size=1M,share=on \
	-device ivshmem-plain,memdev=vtism-chan,id=vtism0 \
	-qmp unix:$W/qmp/vm-s.qmp,server=on,wait=off \
	-qmp unix:$W/vm-s.harness,server=on,wait=off \
	-kernel $W/fill.elf -daemonize -pidfile $W/vm-s.pid || fail "split: vm-s did not start"
SPARSE=$(for b in $(seq 16 30); do printf '0x%x+64,' $((b * 512)); done)
SPARSE=${SPARSE%,}
$H publish /dev/shm/vtism-vm-s.chan "$SPARSE" 200 >"$OUT/publish-s.log" 2>&1 &
PUB_S=$!
check "split: vm-s's hot frames (3.75 MiB spread over 15 THPs) all on node 0, quota 16 MiB held" \
	$H wait $W/vm-s.harness /dev/shm/vtism-vm-s.chan "$SPARSE" 0 2 16 120 hot-only
read -r splits msplits <<<"$(agree vm-s "v['backing']['folio_splits'] if v['backing'] else -1" 'vtism_vm_folio_splits_total\{vm="vm-s"\}')"
hb_s=$(vm_expr vm-s "v['backing']['huge_blocks'] if v['backing'] else -1")
[ "${splits:-0}" -ge 15 ] && [ "$msplits" = "$splits" ] &&
	pass "split: vm-s had $splits THPs split (ctl status and metrics), $hb_s blocks still huge" ||
	fail "split: vm-s splits $splits (metric $msplits), $hb_s blocks huge; moves $(vm_expr vm-s "(v['promoted_bytes'], v['demoted_bytes'], sorted(v['pages_by_outcome'].items()))"); $($H placement $W/vm-s.harness)"
kill $PUB_S "$(cat $W/vm-s.pid)"
vm_s_gone() { [ "$(status_json | python3 -c "import json,sys; print(len([v for v in json.load(sys.stdin)['vms'] if v['name'] == 'vm-s']))")" = 0 ]; }
check "split: vm-s dropped when its QEMU exits" wait_for 20 vm_s_gone

# ---- VMs without a tracker ----
# vm-h: no channel; its vCPU runs tests/host-e2e/hotloop.S, updating every page of guest-physical
# 16-24 MiB (an 8 MiB hot set), RAM on node 2. Only DAMON on the host can see it
# (host_tracking = "auto"). vm-n: no channel, host tracking off, all 64 MiB on node 0 against a
# 16 MiB quota: no signal at all, so the no-signal rule must leave it where it is.
# First a kdamond that is not vtismd's exists: vtismd must wait, touching nothing.
T2=$SECONDS
DAMON=/sys/kernel/mm/damon/admin/kdamonds
"$REPO/tests/host-e2e/mkpayload.sh" $W/hotloop.elf 0x1000000 0x1800000 || fail "host tracking: payload build failed"
echo 1 >$DAMON/nr_kdamonds && echo 1 >$DAMON/0/contexts/nr_contexts && echo vaddr >$DAMON/0/contexts/0/operations
start_bare_vm vm-n 64 0 0 -S
start_bare_vm vm-h 64 0 2 -kernel $W/hotloop.elf
kd_field() { status_json | python3 -c "import json,sys; print(json.load(sys.stdin)['daemon']['host_kdamond']['$1'])" 2>/dev/null; }
kd_state_is() { [ "$(kd_field state)" = "$1" ]; }
check "host tracking: vtismd waits while another kdamond exists" wait_for 60 kd_state_is waiting
echo "   reason: $(kd_field reason)"
[ "$(cat $DAMON/nr_kdamonds)" = 1 ] && [ "$(cat $DAMON/0/contexts/0/operations)" = vaddr ] && [ "$(cat $DAMON/0/state)" = off ] &&
	pass "host tracking: the other kdamond untouched (nr_kdamonds 1, its vaddr context, off)" ||
	fail "host tracking: the other kdamond changed: nr_kdamonds $(cat $DAMON/nr_kdamonds), ops $(cat $DAMON/0/contexts/0/operations 2>&1), state $(cat $DAMON/0/state 2>&1)"
echo 0 >$DAMON/nr_kdamonds
echo "   vm-n: $($H placement $W/vm-n.harness)"
# 8 MiB to find and move once the kdamond runs (within busy_retry_ms, 1 s here); the bound is stated in
# docs/host.md, "Host-side tracking". Its RAM is on host THPs (this host leaves THP at its
# default): vtismd places each as one unit, so its 16 MiB quota holds at every sample.
check "host tracking: vm-h's 8 MiB hot set reaches node 0 (90% of it), by DAMON on the host, within its 16 MiB quota" \
	$H hot $W/vm-h.harness 0x1000+2048 0 90 16 150
echo "   host kdamond: $(kd_field state), pid $(kd_field kdamond_pid), $(kd_field reports) reports"
obs=$(vm_expr vm-h "v['host_tracking']['observations'] if v['host_tracking'] else 0")
prom=$(vm_field vm-h promoted_bytes)
[ "${obs:-0}" -gt 0 ] && [ "$(vm_field vm-h host_tracking_mode)" = auto ] && [ "${prom:-0}" -gt 0 ] &&
	pass "host tracking: ctl status shows vm-h host-tracked ($obs reports, $(vm_expr vm-h "v['host_tracking']['frames']") frames) and vtismd's promotions ($((prom >> 10)) KiB)" ||
	fail "host tracking: vm-h's status: $(vm_field vm-h host_tracking), promoted $prom"
n=$(metric 'vtism_vm_host_tracked\{vm="vm-h"\}')
o=$(metric 'vtism_vm_host_observations_total\{vm="vm-h"\}')
[ "$n" = 1 ] && [ "${o:-0}" -gt 0 ] && pass "host tracking: metrics say vm-h is host-tracked ($o reports)" ||
	fail "host tracking: vtism_vm_host_tracked $n, observations $o"
# vm-h's RAM is on host THPs (QEMU asks for them; this host leaves THP at its default): vtismd
# knows which 2 MiB blocks (PAGEMAP_SCAN, Linux >= 6.7), places each whole (all but one cut by the
# hole below 1 MiB, kept in place), and says so in ctl status and metrics.
read -r hb mhb <<<"$(agree vm-h "v['backing']['huge_blocks'] if v['backing'] else -1" 'vtism_vm_huge_blocks\{vm="vm-h"\}')"
thp=$(vm_expr vm-h "v['backing']['thp_bytes'] >> 20 if v['backing'] else -1")
known=$(vm_expr vm-h "v['backing']['blocks_known'] if v['backing'] else None")
read -r fb mfb <<<"$(agree vm-h "v['backing']['folio_blocks'] if v['backing'] else -1" 'vtism_vm_folio_blocks\{vm="vm-h"\}')"
# Whole blocks against huge ones from one snapshot: hb and fb above are read at two moments, and a
# split (vtismd's) or a collapse (khugepaged's) between them can put fb above hb.
whole_le_huge=$(vm_expr vm-h "v['backing']['folio_blocks'] <= v['backing']['huge_blocks'] if v['backing'] else False")
[ "${hb:-0}" -gt 0 ] && [ "$known" = True ] && [ "$mhb" = "$hb" ] && [ "${fb:-0}" -gt 0 ] && [ "$whole_le_huge" = True ] && [ "$mfb" = "$fb" ] &&
	pass "backing: vm-h has $hb blocks of 2 MiB mapped huge (smaps: $thp MiB of THP), each placed whole, in ctl status and metrics" ||
	fail "backing: vm-h huge_blocks $hb (metric $mhb), placed whole $fb (metric $mfb), whole <= huge in one snapshot: $whole_le_huge, blocks_known $known, THP $thp MiB; problem: $(vm_field vm-h backing_problem)"
check "backing: ctl status names vm-h's THPs" bash -c "$BIN ctl --socket $W/ctl.sock status | grep -A4 '^vm-h ' | grep -q 'backing: THP'"
check "no signal: vm-n's pages stay where they were for 10 s (33 daemon rounds)" $H still $W/vm-n.harness 10
moved=$(vm_expr vm-n "v['promoted_bytes'] + v['demoted_bytes']")
ns=$(vm_field vm-n no_signal)
fast_n=$(vm_expr vm-n "v['fast_bytes'] >> 20")
[ "$moved" = 0 ] && [ "$ns" = True ] && [ "${fast_n:-0}" -gt 16 ] &&
	pass "no signal: vm-n moved 0 bytes, ${fast_n} MiB on fast memory kept over its 16 MiB quota ($($H placement $W/vm-n.harness))" ||
	fail "no signal: vm-n moved $moved bytes, no_signal $ns, fast ${fast_n} MiB"
[ "$(metric 'vtism_vm_host_tracked\{vm="vm-n"\}')" = 0 ] && pass "no signal: vm-n not host-tracked (host_tracking = off)" || fail "no signal: vm-n host-tracked"
# Steady state: vm-h's hot set (four whole folios) is on DRAM and its access pattern does not
# change, so vtismd should stop trading its pages. Churn is what moved but did not fill free
# room: bytes moved less the growth of vm-h's fast memory (a demotion, or a promotion for a
# place another unit left, counts; a promotion into the quota's free room does not). Folios next
# to the hot set, which DAMON's regions straddling its edges report now and then, take that room
# as they are reported, by design (docs/engine.md, "Lukewarm frames": they take free room, never
# a place): one 2 MiB folio 40 s after the hot set in a run by hand, and one inside this window
# in a fresh-clone run at af50369 (plan 6 to 7, DRAM 12 to 14 MiB, nothing demoted). That fill
# is bounded by the room, which the quota check holds. Bound on churn: 2 MiB a minute (one
# folio), over 30 s once converged: no move for 10 s with the room less the reserve (14 MiB)
# full, or for 30 s, within 90 s.
# A plan in flight counts as moving: the engine takes a plan's moves as made when it plans them
# (fast_bytes shows them at once) and the moved counters grow when the plan ends (a fresh-clone
# run at 7f864d7 counted 2 MiB in the window with no plan logged in it, and 10 MiB on DRAM but
# 8 MiB moved when it began), so both ends of the window are read with the mover idle. The
# growth of fast memory is the kernel's (the harness's placement), not the engine's view: at
# af50369 the view had 14 MiB on DRAM, the kernel 12, until a placement sweep corrected it.
snap_h() { # "MOVED BUSY PLANS FAST" of one status read: vm-h's bytes moved, the mover busy, plans made, vm-h's fast bytes
	vm_expr vm-h "'%d %s %d %d' % (v['promoted_bytes'] + v['demoted_bytes'], d['daemon']['mover_busy'], d['daemon']['plans'], v['fast_bytes'])"
}
room_full_h() { [ "${f0:-0}" -ge $((14 << 20)) ]; }
lc=$(wc -l <"$OUT/vtismd.log")
c0=$SECONDS
quiet=$SECONDS
read -r m0 busy p0 f0 <<<"$(snap_h)"
converged_h() { { [ $((SECONDS - quiet)) -ge 10 ] && room_full_h; } || [ $((SECONDS - quiet)) -ge 30 ]; }
while ! converged_h && [ $((SECONDS - c0)) -lt 90 ]; do
	sleep 1
	read -r m busy p0 f0 <<<"$(snap_h)"
	[ "$m" = "$m0" ] && [ "$busy" = False ] || { m0=$m; quiet=$SECONDS; }
done
converged_h && echo "   vm-h: no move and no plan in flight for $((SECONDS - quiet)) s after $((SECONDS - c0)) s more, $((f0 >> 20)) MiB on DRAM" ||
	fail "churn: vm-h still moving after 90 s (moved $m0 bytes in all)"
dram_h() { # vm-h's bytes on node 0, as the kernel has them
	$H placement $W/vm-h.harness | python3 -c "import re,sys; m=re.search(r'[{ ]0: (\d+)', sys.stdin.read()); print(int(m.group(1)) * 4096 if m else 0)"
}
r0=$(dram_h)
sleep 30
t1=$SECONDS
read -r m1 busy p1 f1 <<<"$(snap_h)"
while [ "$busy" != False ] && [ $((SECONDS - t1)) -lt 20 ]; do
	sleep 1
	read -r m1 busy p1 f1 <<<"$(snap_h)"
done
r1=$(dram_h)
moved=$((${m1:-0} - ${m0:-0}))
filled=$((${r1:-0} > ${r0:-0} ? ${r1:-0} - ${r0:-0} : 0))
traded=$((moved > filled ? moved - filled : 0))
churn=$((traded * 2 >> 10))
if [ -n "$m0" ] && [ -n "$m1" ] && [ "$busy" = False ] && [ "$churn" -le 2048 ] && [ "${r1:-0}" -le $((16 << 20)) ]; then
	pass "churn: vm-h traded $churn KiB a minute once converged (bound 2048 KiB a minute: one folio; moved $((moved >> 10)) KiB in 30 s, of which $((filled >> 10)) KiB filled free room, $((r1 >> 20)) MiB of its 16 MiB quota on DRAM)"
else
	fail "churn: vm-h traded $churn KiB a minute once converged (moved $m0 to $m1 bytes in 30 s, on DRAM $r0 to $r1 (engine's view $f0 to $f1), plans $p0 to $p1, mover busy at the end: $busy; bound 2048, quota 16 MiB)"
	# what vtismd planned, moved and warned of since the convergence wait began (each move of a
	# small plan is logged)
	tail -n +"$((lc + 1))" "$OUT/vtismd.log" | sed -e 's/\x1b\[[0-9;]*m//g' | grep -E 'vm-h|plan|quota|WARN' | tail -n 40 | sed 's/^/   /'
	echo "   vm-h: $($H placement $W/vm-h.harness)"
fi
# Hostile guest (before the daemon restarts below): every kind of bad round is rejected and
# counted; vm-a keeps being served.
wait $HOSTILE
for r in gfn_out_of_range bad_magic over_budget reserved_entry_bits; do
	n=$(metric "vtism_hint_rounds_rejected_total\{vm=\"vm-b\",reason=\"$r\"\}")
	if [ "${n:-0}" -gt 0 ]; then pass "hostile: $r rejected and counted ($n)"; else fail "hostile: no $r rejection counted"; fi
done
n=$(metric "vtism_hint_rounds_rejected_total\{vm=\"vm-b\",reason=\"(torn_round|write_in_progress)\"\}")
if [ "${n:-0}" -gt 0 ]; then pass "hostile: torn rounds rejected and counted ($n)"; else fail "hostile: no torn round counted"; fi
# served_after R: vtismd has taken a round of vm-a's after R. Waited for, not read again after a
# fixed 2 s: vtismd promises rounds, not how many a loaded TCG host runs in 2 s.
served_after() { local r; r=$(vm_field vm-a last_round); [ "$r" != absent ] && [ "$r" -gt "$1" ]; }
r1=$(vm_field vm-a last_round)
if wait_for 30 served_after "$r1"; then pass "hostile: vm-a still served (round $r1 -> $(vm_field vm-a last_round))"; else fail "hostile: vm-a not served ($r1 -> $(vm_field vm-a last_round) in 30 s)"; fi
fb=$(python3 - <<EOF
import mmap, struct
with open("/dev/shm/vtism-vm-b.chan", "r+b") as f:
    m = mmap.mmap(f.fileno(), 4096)
    print(struct.unpack_from("<Q", m, 0x828)[0])
EOF
)
if [ "${fb:-0}" -gt 0 ]; then pass "hostile: feedback tells the guest ($fb rejected rounds)"; else fail "hostile: feedback rejected_rounds is $fb"; fi
kill -0 "$(cat $W/vtismd.pid)" && pass "hostile: daemon alive" || fail "hostile: daemon died"

# vtismd killed (-9) while its kdamond runs: the kdamond outlives it, and DAMON's sysfs cannot
# add another beside it. The next vtismd finds it by its record, turns it off and removes it,
# then starts its own.
kpid=$(kd_field kdamond_pid)
kill -9 "$(cat $W/vtismd.pid)"
wait_for 10 bash -c "! kill -0 $(cat $W/vtismd.pid)"
left="nr_kdamonds $(cat $DAMON/nr_kdamonds), state $(cat $DAMON/0/state 2>&1), pid $(cat $DAMON/0/pid 2>&1)"
start_daemon || fail "daemon restart after kill -9 failed"
kd_new() { kd_state_is running && [ "$(kd_field kdamond_pid)" != "$kpid" ]; }
if wait_for 60 kd_new && grep -q "took back the host kdamond a killed vtismd left behind" "$OUT/vtismd.log"; then
	pass "host tracking: after kill -9 ($left) the next vtismd took its kdamond back and runs a new one (pid $kpid -> $(kd_field kdamond_pid))"
else
	fail "host tracking: after kill -9 ($left): state $(kd_field state) ($(kd_field reason)), pid $(kd_field kdamond_pid)"
fi
kill "$(cat $W/vm-h.pid)" "$(cat $W/vm-n.pid)"
vms_named() { [ "$(status_json | python3 -c "import json,sys; print(len([v for v in json.load(sys.stdin)['vms'] if v['name'] in ('vm-h','vm-n')]))")" = 0 ]; }
check "host tracking: vm-h and vm-n dropped when their QEMUs exit" wait_for 20 vms_named
kd_gone() { [ "$(cat $DAMON/nr_kdamonds)" = 0 ] && kd_state_is idle; }
check "host tracking: vtismd removed its kdamond when no VM needed it (nr_kdamonds 0)" wait_for 20 kd_gone
echo "== host tracking and no-signal checks took $((SECONDS - T2))s"

# The hot set moves: 24 MiB new, quota 32 MiB (30 MiB after the reserve); old frames must make
# room and the quota must hold at every sample while pages move.
$H quota $W/vm-a.sampler 0,1 32 25 >"$OUT/quota-a.log" 2>&1 &
QUOTA=$!
echo "0x4000+4096,0x6000+2048" >/dev/shm/vtism-vm-a.chan.spec
check "hot-set change: the new 24 MiB set reaches node 0 within the quota" \
	$H wait $W/vm-a.harness /dev/shm/vtism-vm-a.chan 0x4000+4096,0x6000+2048 0 2 32 120 hot-only max-rounds=60
if wait $QUOTA; then pass "quota: $(tail -1 "$OUT/quota-a.log")"; else fail "quota: $(tail -2 "$OUT/quota-a.log" | tr '\n' ' ')"; fi

# Control socket and metrics.
check "ctl status: table lists vm-a" bash -c "$BIN ctl --socket $W/ctl.sock status | tee /dev/stderr | grep -q '^vm-a '"
check "metrics: per-VM, per-node and daemon CPU series" bash -c "$H get $METRICS /metrics | grep -c -E '^(vtism_vm_resident_bytes|vtism_node_vm_resident_bytes|vtism_process_cpu_seconds_total|vtism_mover_queue_depth|vtism_vm_hot_set_bytes)' | grep -qv '^0$' && echo ok"

# The kernel's own tiering beside vtismd (docs/host.md, "The kernel's own tiering"): reported as
# the kernel has it, and a change seen at the next re-read (10 s), warned of, in the status and
# the metrics. The emulated host is this test's own; its setting is put back.
nb0=$(cat /proc/sys/kernel/numa_balancing)
kt_is() { [ "$(status_json | python3 -c "import json,sys; print(json.load(sys.stdin)['daemon']['kernel_tiering']['numa_balancing'])")" = "$1" ] && echo "numa_balancing $1"; }
check "kernel tiering: ctl status says kernel.numa_balancing=$nb0, as the kernel has it" kt_is "$nb0"
nb1=$((nb0 == 2 ? 0 : 2))
echo $nb1 >/proc/sys/kernel/numa_balancing
check "kernel tiering: kernel.numa_balancing set to $nb1 is seen within 15 s" wait_for 15 kt_is $nb1
echo 2 >/proc/sys/kernel/numa_balancing
check "kernel tiering: NUMA balancing's tiering mode is warned of in the log, ctl status and the metrics" \
	wait_for 15 bash -c "grep -q 'NUMA balancing is on and moves guest pages too' '$OUT/vtismd.log' &&
		$BIN ctl --socket $W/ctl.sock status | grep -q '^kernel NUMA balancing: on (kernel.numa_balancing=2)' &&
		$H get $METRICS /metrics | grep -q '^vtism_host_numa_balancing 2\$' && echo warned"
echo "$nb0" >/proc/sys/kernel/numa_balancing

# SIGHUP reload: a new quota for vm-a.
write_config 48 2
kill -HUP "$(cat $W/vtismd.pid)"
check "SIGHUP: vm-a's quota becomes 48 MiB" wait_for 10 bash -c "[ \"\$($BIN ctl --socket $W/ctl.sock status --json | python3 -c \"import json,sys; print([v['quota_bytes'] for v in json.load(sys.stdin)['vms'] if v['name']=='vm-a'][0])\")\" = $((48 << 20)) ]"
fb=$(python3 -c "
import mmap, struct
with open('/dev/shm/vtism-vm-a.chan', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 4096); print(struct.unpack_from('<Q', m, 0x820)[0])")
# The guest is told its quota rounded to the nearest 1/32 of its RAM (docs/host.md, "Threat
# model": exact quotas would tell a guest the other VMs' demand in pool mode).
want=$($BIN ctl --socket $W/ctl.sock status --json | python3 -c "
import json, sys
ram = [v['ram_bytes'] for v in json.load(sys.stdin)['vms'] if v['name'] == 'vm-a'][0]
step = max((ram // 32) & ~4095, 4096)
print(min(max((48 << 20) + step // 2, step) // step * step, max(ram, step)))")
[ "$fb" = "$want" ] && pass "feedback: vm-a's channel carries its new quota ($fb: 48 MiB to 1/32 of its RAM)" ||
	fail "feedback: fast_quota_bytes is $fb, want $want (48 MiB to 1/32 of its RAM)"
echo '[daemon]
interval_ms = 0' >$W/bad.toml
check "check-config names the bad field" bash -c "out=\$($BIN host --check-config -c $W/bad.toml 2>&1); rc=\$?; echo \"\$out\"; [ \$rc -ne 0 ] && echo \"\$out\" | grep -q daemon.interval_ms"

# Reset (reboot without OS): the VM stays managed, its channel is re-read from round 1.
python3 - "$W/vm-d.harness" <<'EOF'
import socket, sys, json
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
f.readline()
for c in ("qmp_capabilities", "system_reset"):
    f.write((json.dumps({"execute": c}) + "\n").encode()); f.flush()
    while "return" not in json.loads(f.readline()): pass
EOF
# The reset is taken in one re-read of the same memory map: the channel restarts, the engine
# forgets vm-d's hotness and keeps its placement (not re-registered, no sweep started over).
reset_taken() { [ "$(vm_field vm-d resyncs)" -ge 1 ] && [ "$(vm_field vm-d memory_map_changes)" = 0 ]; }
check "reset: vm-d re-read once for it, same memory map, not re-registered" wait_for 15 reset_taken
[ "$(vm_field vm-d name)" = vm-d ] && pass "reset: vm-d still managed after system_reset" || fail "reset: vm-d dropped after reset"

# Memory hot-plug: a 32 MiB DIMM (on node 2) appears in vm-d's memory map; the daemon picks it up.
ram_d=$(vm_field vm-d ram_bytes)
python3 - "$W/vm-d.harness" <<'EOF'
import socket, sys, json
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
f.readline()
for c, a in (("qmp_capabilities", None),
             ("object-add", {"qom-type": "memory-backend-ram", "id": "hp1", "size": 32 << 20,
                             "host-nodes": [2], "policy": "bind", "prealloc": True}),
             ("device_add", {"driver": "pc-dimm", "id": "dimm1", "memdev": "hp1"})):
    m = {"execute": c}
    if a: m["arguments"] = a
    f.write((json.dumps(m) + "\n").encode()); f.flush()
    while True:
        r = json.loads(f.readline())
        if "error" in r: print("hotplug:", r["error"]); break
        if "return" in r: break
EOF
check "hot-plug: vm-d's new 32 MiB DIMM is managed" wait_for 30 bash -c "[ \"\$($BIN ctl --socket $W/ctl.sock status --json | python3 -c \"import json,sys; print([v['ram_bytes'] for v in json.load(sys.stdin)['vms'] if v['name']=='vm-d'][0])\")\" = $((ram_d + (32 << 20))) ]"
check "hot-plug: vm-d re-registered for its new memory map" [ "$(vm_field vm-d memory_map_changes)" -ge 1 ]
check "hot-plug: vm-d's hot set still on node 1 after re-registration" \
	$H wait $W/vm-d.harness /dev/shm/vtism-vm-d.chan 0x800+2048 1 2 16 60 hot-only

# Kill a QEMU in the middle of a migration (vm-c: 96 MiB hot, 6 MB/s per-VM limit).
start_vm vm-c 128 0
$H publish /dev/shm/vtism-vm-c.chan 0x1000+24576 200 >"$OUT/publish-c.log" 2>&1 &
PUB_C=$!
if wait_for 60 bash -c "[ \"\$($BIN ctl --socket $W/ctl.sock status --json | python3 -c \"import json,sys; print([v['promoted_bytes'] for v in json.load(sys.stdin)['vms'] if v['name']=='vm-c'][0])\" 2>/dev/null || echo 0)\" -gt 0 ]"; then
	kill -9 "$(cat $W/vm-c.pid)"
	kill $PUB_C 2>/dev/null
	check "qemu killed mid-migration: vm-c dropped" wait_for 15 bash -c "[ \"\$($BIN ctl --socket $W/ctl.sock status --json | python3 -c \"import json,sys; print(len([v for v in json.load(sys.stdin)['vms'] if v['name']=='vm-c']))\")\" = 0 ]"
	kill -0 "$(cat $W/vtismd.pid)" && pass "qemu killed mid-migration: daemon alive" || fail "qemu killed mid-migration: daemon died"
	r1=$(vm_field vm-a last_round)
	wait_for 30 served_after "$r1" && pass "qemu killed mid-migration: others still served (round $r1 -> $(vm_field vm-a last_round))" ||
		fail "qemu killed: vm-a not served ($r1 -> $(vm_field vm-a last_round) in 30 s)"
else
	fail "qemu killed mid-migration: vm-c never started moving"
fi

# Kill the daemon itself in the middle of a migration, then restart it.
# (vm-a is limited to 2 MB/s since the reload: 24 MiB take about 12 s.) Kill as soon as the
# mover is busy with the new hot set.
echo "0x2000+6144" >/dev/shm/vtism-vm-a.chan.spec
wait_for 30 bash -c "$H get $METRICS /metrics | grep -q '^vtism_mover_busy 1'"
kill -9 "$(cat $W/vtismd.pid)"
if $H wait $W/vm-a.harness /dev/shm/vtism-vm-a.chan 0x2000+6144 0 2 48 0 hot-only >/dev/null 2>&1; then
	fail "daemon killed: the migration had already finished (test would prove nothing)"
else
	pass "daemon killed mid-migration: $($H placement $W/vm-a.harness)"
fi
check "daemon killed: vm-a's QEMU unaffected and its memory readable" $H placement $W/vm-a.harness
start_daemon && pass "daemon killed: restarts over its stale control socket" || fail "daemon killed: restart failed"
# At 2 MB/s (burst 2 MB) the 24 MiB need ~9-12 s (unlimited: under 2 s; the check starts 1-3 s after the restart): under 4 s means
# the per-VM rate limit is not applied; 5 guest rounds/s over ~13 s is ~65 rounds.
check "daemon killed: after restart vm-a's hot set reaches node 0 within 48 MiB, at the VM's 2 MB/s limit" \
	$H wait $W/vm-a.harness /dev/shm/vtism-vm-a.chan 0x2000+6144 0 2 48 120 hot-only max-rounds=150 min-secs=4

# Daemon CPU per round per GiB managed (steady state: hints every 200 ms, nothing to move).
c1=$(status_json | python3 -c "import json,sys; d=json.load(sys.stdin)['daemon']; print(d['round_cpu_seconds'], d['rounds'], d['cpu_seconds'], d['managed_gib'])")
sleep 10
c2=$(status_json | python3 -c "import json,sys; d=json.load(sys.stdin)['daemon']; print(d['round_cpu_seconds'], d['rounds'], d['cpu_seconds'], d['managed_gib'])")
python3 - "$c1" "$c2" <<'EOF' | tee -a "$OUT/bench.txt"
import sys
a = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
rounds = b[1] - a[1]; gib = b[3]
print(f"daemon cpu: {gib:.3f} GiB managed, {rounds:.0f} rounds in 10 s, "
      f"main loop {1e3*(b[0]-a[0])/rounds:.3f} ms/round = {1e3*(b[0]-a[0])/rounds/gib:.3f} ms per round per GiB; "
      f"whole process {1e3*(b[2]-a[2])/rounds:.3f} ms/round")
EOF

# Orderly QEMU exit: a VM that quits is dropped.
python3 - "$W/vm-b.harness" <<'EOF'
import socket, sys, json
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
f.readline()
for c in ("qmp_capabilities", "quit"):
    f.write((json.dumps({"execute": c}) + "\n").encode()); f.flush()
    try:
        while "return" not in json.loads(f.readline()): pass
    except Exception: pass
EOF
check "quit: vm-b dropped after QEMU exits" wait_for 15 bash -c "[ \"\$($BIN ctl --socket $W/ctl.sock status --json | python3 -c \"import json,sys; print(len([v for v in json.load(sys.stdin)['vms'] if v['name']=='vm-b']))\")\" = 0 ]"

ctl status >"$OUT/status-final.txt" 2>&1
kill $PUB_A $PUB_D 2>/dev/null
kill -TERM "$(cat $W/vtismd.pid)"
wait_for 10 bash -c "! kill -0 $(cat $W/vtismd.pid)" && pass "SIGTERM: daemon stops" || fail "SIGTERM: daemon still running"
for v in vm-a vm-d; do kill "$(cat $W/$v.pid)" 2>/dev/null; done
rm -f $W/qmp/vm-*.qmp # vm-c was killed with -9 and left its socket

# ---- One pool of fast memory, with local DRAM full ----
# A process this test starts fills node 0 (socket 0's DRAM) and keeps it under 24 MiB free;
# vtismd keeps 96 MiB free on every node, so to it node 0 has no room. Two VMs on socket 0 share
# a 48 MiB pool, 24 MiB each at first (HMM-V's limits: 18 - 30 MiB): p1's guest reports a 40 MiB
# hot set, p2's 4 MiB. The pool must move quota to p1, up to its maximum and never taking p2
# below its minimum, and their promotions must go to remote DRAM (node 1), never to node 0.
write_pool_config() { # write_pool_config [EXTRA LINE FOR p1] [EXTRA [topology] LINE]
	{
		daemon_sections
		cat <<EOF
[topology]
min_free_mib = 96
${2:-}
[pool]
mode = "pool"
fast_mib = 48
rebalance_interval_ms = 1000
max_step_percent = 25
hysteresis_percent = 5
headroom_percent = 10
[defaults]
manage_discovered = false
[[vm]]
name = "p1"
fast_quota_mib = 24
${1:-}
[[vm]]
name = "p2"
fast_quota_mib = 24
EOF
	} >$W/pool.toml
}
T1=$SECONDS
# Host THPs at this kernel's default for these VMs' RAM too: the guests hint 4 KiB frames and
# vtismd places the host's 2 MiB folios whole, within each quota.
echo "   host THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
taskset -c 0,2 $H hog 0 24 >"$OUT/hog.log" 2>&1 &
HOG=$!
if wait_for 60 grep -q '^hog:' "$OUT/hog.log"; then
	pass "local DRAM full: $(cat "$OUT/hog.log")"
else
	fail "local DRAM full: the hog did not fill node 0 ($(cat "$OUT/hog.log"))"
fi
start_vm p1 64 0
start_vm p2 64 0
write_pool_config
check "pool: check-config accepts the pool section" bash -c "$BIN host --check-config -c $W/pool.toml | tee /dev/stderr | grep -q 'pool mode, 48 MiB'"
start_daemon $W/pool.toml || fail "pool: daemon did not start"
$H publish /dev/shm/vtism-p1.chan 0x1000+10240 200 >"$OUT/publish-p1.log" 2>&1 &
PUB_P1=$!
$H publish /dev/shm/vtism-p2.chan 0x1000+1024 200 >"$OUT/publish-p2.log" 2>&1 &
PUB_P2=$!
# Every 200 ms while the checks below run: both quotas within 18 - 30 MiB, sum <= 48 MiB.
$H quotas $W/ctl.sock 120 48 p1=18:30 p2=18:30 until=$W/quotas.stop >"$OUT/quotas.log" 2>&1 &
QUOTAS=$!
quotas_are() { [ "$(ctl_quota p1)" = $(($1 << 20)) ] && [ "$(ctl_quota p2)" = $(($2 << 20)) ]; }
check "pool: p1's quota grows to its 30 MiB maximum, p2's shrinks to its 18 MiB minimum" \
	wait_for 60 quotas_are 30 18
r1=$(vm_expr p1 "v['last_quota_change']['reason']")
r2=$(vm_expr p2 "v['last_quota_change']['reason']")
h1=$(vm_expr p1 "v['hot_set_bytes'] >> 20")
[ "$r1" = grow ] && [ "$r2" = shrink ] && pass "pool: ctl status says why (p1 $r1 with a ${h1} MiB hot set, p2 $r2)" ||
	fail "pool: last changes p1 $r1, p2 $r2 (want grow, shrink)"
n1=$(metric 'vtism_vm_quota_changes_total\{vm="p1",reason="grow"\}')
n2=$(metric 'vtism_vm_quota_changes_total\{vm="p2",reason="shrink"\}')
[ "${n1:-0}" -gt 0 ] && [ "${n2:-0}" -gt 0 ] && pass "pool: metrics count the changes by reason (p1 grow $n1, p2 shrink $n2)" ||
	fail "pool: vtism_vm_quota_changes_total p1 grow $n1, p2 shrink $n2"
check "pool: p1 holds more fast memory than its 24 MiB share, never above 30 MiB, none on full node 0" \
	$H fast $W/p1.harness 0,1 25 30 90 forbid=0
check "two sockets: p2's hot set goes to remote DRAM (node 1) while node 0 is full" \
	$H wait $W/p2.harness /dev/shm/vtism-p2.chan 0x1000+1024 1 2 30 90 hot-only
f0=$(metric 'vtism_node_free_bytes\{node="0"\}')
w0=$(metric 'vtism_mover_worker_pages_total\{node="0",dir="promote"\}')
w1=$(metric 'vtism_mover_worker_pages_total\{node="1",dir="promote"\}')
[ "$f0" = 0 ] && [ "$w0" = 0 ] && [ "${w1:-0}" -gt 0 ] && pass "two sockets: node 0 had no room, node 1's mover worker promoted $w1 pages, node 0's none" ||
	fail "two sockets: node 0 free $f0, promoted pages by worker: node 0 $w0, node 1 $w1"
# SIGHUP: a lower maximum for p1 clamps its quota, and its fast memory follows.
write_pool_config "quota_max_mib = 26"
kill -HUP "$(cat $W/vtismd.pid)"
clamped() { [ "$(ctl_quota p1)" = $((26 << 20)) ] && [ "$(vm_expr p1 "v['last_quota_change']['reason']")" = clamp ]; }
check "pool reload: p1's quota clamped to its new 26 MiB maximum" wait_for 20 clamped
check "pool reload: p1's fast memory comes down within 26 MiB" wait_for 30 $H fast $W/p1.harness 0,1 0 26 0
touch $W/quotas.stop
if wait $QUOTAS; then pass "pool: $(tail -1 "$OUT/quotas.log")"; else fail "pool: $(tail -2 "$OUT/quotas.log" | tr '\n' ' ')"; fi
w0=$(metric 'vtism_mover_worker_pages_total\{node="0",dir="promote"\}')
kill "$HOG"
wait_for 10 bash -c "! kill -0 $HOG" && pass "local DRAM full: hog $HOG stopped" || fail "local DRAM full: hog $HOG still running"
# Node 0 has room again: what the two VMs hold on remote DRAM comes home (AutoTiering's CPM),
# their fast memory as it was.
check "locality: p2's hot set comes home to node 0 from remote DRAM once node 0 has room" \
	$H hot $W/p2.harness 0x1000+1024 0 95 0 60
check "locality: p1's fast memory comes home to node 0 (at least 22 of its 26 MiB)" \
	$H fast $W/p1.harness 0 22 26 60
h1=$(metric 'vtism_mover_worker_pages_total\{node="0",dir="promote"\}')
[ "${h1:-0}" -gt "${w0:-0}" ] && wait_for 10 grep -qE 'kind[^ ]*=[^ ]*Home' "$OUT/vtismd.log" &&
	pass "locality: node 0's mover worker moved $((${h1:-0} - ${w0:-0})) pages home, and vtismd's log names the moves Home" ||
	fail "locality: node 0's worker pages $w0 -> $h1; Home moves in the log: $(grep -cE 'kind[^ ]*=[^ ]*Home' "$OUT/vtismd.log")"
# A tenant takes node 0 down to 48 MiB free, once; then a free watermark of 64 MiB (SIGHUP):
# vtismd demotes the coldest of its own frames on node 0 (16 MiB of the 28) until node 0 is back
# (free memory moves by a few MiB with everything else the host does: 58 is the check). Free is
# MemFree and the free pages on node 0's CPUs' lists, as vtismd counts it: after a migration tens
# of MiB sit there (docs/host.md). The hog runs on node 0's CPUs, whose lists it takes first.
taskset -c 0,2 $H hog 0 48 once >"$OUT/hog2.log" 2>&1 &
HOG2=$!
wait_for 60 grep -q '^hog:' "$OUT/hog2.log" || fail "watermark: the second hog did not fill node 0 ($(cat "$OUT/hog2.log"))"
write_pool_config "quota_max_mib = 26" "free_watermark_mib = 64"
kill -HUP "$(cat $W/vtismd.pid)"
node0_free_mib() { # MemFree and node 0's free pages on its own CPUs' lists (0 and 2)
	local kib pcp
	kib=$(awk '/MemFree/ { print $4 }' /sys/devices/system/node/node0/meminfo)
	pcp=$(awk '/^Node/ { n = ($2 == "0,") } /cpu:/ { c = $2 } n && (c == 0 || c == 2) && $1 == "count:" { p += $2 } END { print p + 0 }' /proc/zoneinfo)
	echo $(((kib + pcp * $(getconf PAGESIZE) / 1024) / 1024))
}
node0_back() { [ "$(node0_free_mib)" -ge 58 ]; }
if wait_for 30 node0_back; then
	pass "watermark: node 0 back to $(node0_free_mib) MiB free (watermark 64) after $(cat "$OUT/hog2.log" | sed 's/^hog: //'), by demoting vtismd's own frames"
else
	fail "watermark: node 0 at $(node0_free_mib) MiB free (watermark 64); $(cat "$OUT/hog2.log")"
fi
wm=$(metric '^vtism_watermark_demoted_bytes_total ')
hm=$(metric 'vtism_planned_bytes_total\{kind="home"\}')
[ "${wm:-0}" -gt 0 ] && [ "${hm:-0}" -gt 0 ] &&
	pass "watermark: the metrics count $((wm >> 20)) MiB demoted for the watermark and $((hm >> 20)) MiB moved home" ||
	fail "watermark: vtism_watermark_demoted_bytes_total $wm, vtism_planned_bytes_total{kind=home} $hm"
check "watermark: the hog that filled node 0 is untouched" kill -0 "$HOG2"
kill "$HOG2"
ctl status >"$OUT/status-pool.txt" 2>&1
ctl status --json >"$OUT/status-pool.json" 2>&1
cat "$OUT/status-pool.txt"
kill $PUB_P1 $PUB_P2 2>/dev/null
kill -TERM "$(cat $W/vtismd.pid)"
wait_for 10 bash -c "! kill -0 $(cat $W/vtismd.pid)" || fail "pool: daemon did not stop"
echo "== pool and two-socket checks took $((SECONDS - T1))s"

# Two CXL expanders promoting into node 0 at once (seed 002's double-promote experiment): q2's
# RAM on node 2, q3's on node 3, both VMs on node 0's CPUs, every frame hot. Each VM holds 4 MiB
# of fast memory, then a reload raises both quotas to 74 MiB and one plan promotes 68 MiB from
# each node: first with one promotion worker for node 0 (sources take turns), then, on fresh
# VMs, with a worker per source node on node 0's two CPUs. The mover's plan time gives each
# run's throughput; the workers' peak inside move_pages shows the overlap. A VM holds its quota
# less the engine's reserve (2 MiB, at most a quarter of the quota), in whole 2 MiB host folios.
T2=$SECONDS
write_sources_config() { # write_sources_config PARALLEL QUOTA_MIB [NEAR_SLOW]
	{
		daemon_sections | sed "s/^\[mover\]\$/[mover]\nparallel_sources = $1/"
		cat <<EOF
[engine]
near_slow = ${3:-false}
[defaults]
manage_discovered = false
[[vm]]
name = "q2"
fast_quota_mib = $2
[[vm]]
name = "q3"
fast_quota_mib = $2
EOF
	} >$W/sources.toml
}
start_sources_vms() {
	start_vm q2 80 0 2
	start_vm q3 80 2 3
	$H publish /dev/shm/vtism-q2.chan 0x100+20224 200 >"$OUT/publish-q2.log" 2>&1 &
	PUB_Q2=$!
	$H publish /dev/shm/vtism-q3.chan 0x100+20224 200 >"$OUT/publish-q3.log" 2>&1 &
	PUB_Q3=$!
}
mover_idle() { [ "$(metric '^vtism_mover_busy ')" = 0 ]; }
promote_both() { # promote_both LABEL PARALLEL: raise both quotas to 74 MiB; writes "MIB SECONDS PEAK"
	check "sources ($1): q2 and q3 hold 4 MiB of node 0" bash -c \
		"$H fast $W/q2.harness 0 4 6 60 && $H fast $W/q3.harness 0 4 6 60"
	wait_for 10 mover_idle
	local s0 b0 s1 b1
	s0=$(metric '^vtism_mover_plan_seconds_sum')
	b0=$(metric 'vtism_vm_moved_bytes_total\{vm="q[23]",dir="promote"\}')
	write_sources_config "$2" 74
	kill -HUP "$(cat $W/vtismd.pid)"
	check "sources ($1): both quotas raised to 74 MiB, 68 MiB from each node reach node 0" bash -c \
		"$H fast $W/q2.harness 0 72 74 60 && $H fast $W/q3.harness 0 72 74 60"
	wait_for 10 mover_idle
	s1=$(metric '^vtism_mover_plan_seconds_sum')
	b1=$(metric 'vtism_vm_moved_bytes_total\{vm="q[23]",dir="promote"\}')
	echo "$(((b1 - b0) >> 20)) $(python3 -c "print(f'{$s1 - $s0:.3f}')") $(metric '^vtism_mover_lanes_moving_peak')" >"$OUT/sources-$1.txt"
}
write_sources_config false 6
start_sources_vms
start_daemon $W/sources.toml || fail "sources: daemon did not start"
promote_both serial false
read -r mib_s secs_s peak_s <"$OUT/sources-serial.txt"
kill $PUB_Q2 $PUB_Q3
kill "$(cat $W/q2.pid)" "$(cat $W/q3.pid)"
gone_q() { [ "$(vm_field q2 name)" = absent ] && [ "$(vm_field q3 name)" = absent ]; }
wait_for 20 gone_q || fail "sources: vtismd still lists q2 or q3 after QEMU exited"
write_sources_config true 6
kill -HUP "$(cat $W/vtismd.pid)"
sleep 1
start_sources_vms
promote_both parallel true
read -r mib_p secs_p peak_p <"$OUT/sources-parallel.txt"
ratio=$(python3 -c "print(f'{($mib_p / $secs_p) / ($mib_s / $secs_s):.2f}')" 2>/dev/null || echo "?")
summary="one worker: $mib_s MiB in $secs_s s, at most $peak_s worker moving; a worker per source: $mib_p MiB in $secs_p s, $peak_p at once; throughput ratio $ratio"
[ "$peak_s" = 1 ] && [ "${peak_p:-0}" -ge 2 ] && pass "sources: nodes 2 and 3 promote into node 0 in parallel ($summary)" ||
	fail "sources: want 1 worker moving at a time with parallel_sources = false and 2 with true ($summary)"
echo "sources,$mib_s,$secs_s,$peak_s,$mib_p,$secs_p,$peak_p,$ratio" >>"$OUT/bench.txt"
# Locality within the slow tier (off above, where each VM's RAM sits on its node on purpose): q3's
# frames left on node 3, which its guest keeps hinting, move to node 2, nearer its home node 0,
# and its fast memory stays as it was.
write_sources_config true 74 true
kill -HUP "$(cat $W/vtismd.pid)"
check "near slow: q3's hinted frames on node 3 move to node 2, nearer its home" \
	$H fast $W/q3.harness 2 6 8 60
check "near slow: none of q3's frames left on node 3, 72-74 MiB still on node 0" bash -c \
	"$H fast $W/q3.harness 3 0 0 0 && $H fast $W/q3.harness 0 72 74 5"
ns=$(metric 'vtism_vm_near_slow_moved_bytes_total\{vm="q3"\}')
np=$(metric 'vtism_planned_bytes_total\{kind="near_slow"\}')
[ "${ns:-0}" -gt 0 ] && [ "${np:-0}" -gt 0 ] && pass "near slow: counted apart from demotions ($((ns >> 10)) KiB moved, $((np >> 10)) KiB planned)" ||
	fail "near slow: vtism_vm_near_slow_moved_bytes_total{vm=q3} $ns, vtism_planned_bytes_total{kind=near_slow} $np"
kill $PUB_Q2 $PUB_Q3 2>/dev/null
kill -TERM "$(cat $W/vtismd.pid)"
wait_for 10 bash -c "! kill -0 $(cat $W/vtismd.pid)" || fail "sources: daemon did not stop"
echo "== parallel sources took $((SECONDS - T2))s"

# Mover throughput vs memcpy in this emulated host (node 2 -> node 0).
if [ "${VTISM_E2E_BENCH:-1}" = 1 ]; then
	taskset -c 0 $H bench 64 2 0 16,256,4096,65536 | tee -a "$OUT/bench.txt"
fi
for p in $W/*.pid; do kill "$(cat $p)" 2>/dev/null; done
echo "== inner done in $((SECONDS - T0))s"
