#!/bin/bash
# Runs inside the packaging test's emulated host (Debian 12 booted with systemd from
# tests/packaging/mkrootfs.sh's image, 3 NUMA nodes: DRAM 0 and 1, CPU-less slower node 2) as
# root, from the vtism-test unit. Installs the two packages as an operator would and checks them:
# vtismd's package (files, conffile, unit, tmpfiles), the guest module's DKMS package (built by
# DKMS for the running kernel and loaded), then a libvirt domain with libvirt's own ivshmem-plain
# <shmem> device, managed by vtismd started from the installed unit. PASS/FAIL lines go to
# $OUT/results, logs to $OUT/.
set -u
REPO=${REPO:?the repository path}
OUT=${OUT:?the results directory}
DEBS=$REPO/build/deb
H=$REPO/target/release/examples/e2e-harness
DASHBOARD=$REPO/packaging/grafana-vtism-host.json
: >"$OUT/results"
exec 2>&1
T0=$SECONDS

# shellcheck source=tests/lib/checks.sh
. "$REPO/tests/lib/checks.sh"
wait_for() { # wait_for SECONDS COMMAND...: poll until the command succeeds
	local end=$((SECONDS + $1))
	shift
	while [ $SECONDS -lt $end ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	"$@"
}
step() { echo "== $* (at $((SECONDS - T0)) s)"; }
vm_field() { # vm_field EXPR: a Python expression over web1's row `v` of `vtism ctl status --json`
	vtism ctl status --json 2>/dev/null | python3 -c "import json,sys; v=[x for x in json.load(sys.stdin)['vms'] if x['name']=='web1']; print(($1) if v else 'absent')" 2>/dev/null
}
# MiB of the VM's guest RAM on each node, from the kernel (/proc/PID/numa_maps), not from vtismd.
ram_nodes() {
	python3 - "$1" <<'PY'
import re, sys
best = None
for line in open(f"/proc/{sys.argv[1]}/numa_maps"):
    f = line.split()
    pages = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"\bN(\d+)=(\d+)", line)}
    kp = next((int(x.split("=")[1]) for x in f if x.startswith("kernelpagesize_kB=")), 4)
    if "anon=" in line and (best is None or sum(pages.values()) * kp > best[0]):
        best = (sum(pages.values()) * kp, {n: p * kp // 1024 for n, p in pages.items()})
print(" ".join(f"N{n}={m}" for n, m in sorted(best[1].items())) if best else "none")
PY
}
mib_on() { ram_nodes "$1" | tr ' ' '\n' | sed -n "s/^N$2=//p" | grep . || echo 0; }
export -f ram_nodes mib_on wait_for

step "emulated host: $(uname -r), nodes $(cat /sys/devices/system/node/online), systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(virsh --version 2>/dev/null | sed 's/^/libvirt /'), AppArmor $(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)"

# ---- vtismd's package ----
step "dpkg -i vtismd"
check "vtismd: dpkg -i installs the package" dpkg -i "$DEBS"/vtismd_*_amd64.deb
check "vtismd: binary, unit, tmpfiles entry, config, docs at their paths" bash -c '
	for f in /usr/bin/vtism /usr/lib/systemd/system/vtismd.service /usr/lib/tmpfiles.d/vtismd.conf \
		/etc/vtism/vtismd.toml /usr/share/doc/vtismd/host.md /usr/share/doc/vtismd/copyright \
		/usr/share/doc/vtismd/examples/grafana-vtism-host.json; do [ -f $f ] || { echo "missing $f"; exit 1; }; done
	vtism --version'
check "vtismd: /etc/vtism/vtismd.toml is a conffile" \
	bash -c "dpkg-query -W -f='\${Conffiles}\n' vtismd | grep ' /etc/vtism/vtismd.toml '"
check "vtismd: man pages from the CLI (man vtism-host documents --check-config)" bash -c '
	man -w vtism-host && ls /usr/share/man/man1/vtism*.1.gz | wc -l | grep -qv "^0$" &&
	zcat /usr/share/man/man1/vtism-host.1.gz | grep -q "^\.TH" &&
	zcat /usr/share/man/man1/vtism-host.1.gz | grep -q "check\\\\-config" &&
	echo "$(ls /usr/share/man/man1/vtism*.1.gz | wc -l) pages"'
check "vtismd: bash completion completes the subcommands" bash -c '
	source /usr/share/bash-completion/completions/vtism &&
	COMP_WORDS=(vtism ho) COMP_CWORD=1 COMP_LINE="vtism ho" COMP_POINT=8 && _vtism vtism ho vtism &&
	[ "${COMPREPLY[*]}" = host ] && test -f /usr/share/zsh/vendor-completions/_vtism &&
	test -f /usr/share/fish/vendor_completions.d/vtism.fish && echo "vtism ho<TAB> -> ${COMPREPLY[*]}"'
check "vtismd: postinst created /run/vtism/qmp (2770 root:kvm) from the tmpfiles entry" \
	bash -c '[ "$(stat -c "%a %U %G" /run/vtism/qmp)" = "2770 root kvm" ] && stat -c "%a %U %G" /run/vtism/qmp'
check "vtismd: systemd-analyze verify vtismd.service is clean" bash -c '
	out=$(systemd-analyze verify vtismd.service 2>&1); rc=$?; echo "$out"; [ $rc = 0 ] && [ -z "$out" ] && echo clean'
check "vtismd: installing neither enables nor starts the daemon" bash -c '
	[ "$(systemctl is-enabled vtismd)" = disabled ] && ! systemctl is-active -q vtismd && echo disabled, inactive'
check "vtismd: the shipped /etc/vtism/vtismd.toml is valid" vtism host --check-config

# ---- the guest module's DKMS package, in this (emulated) machine with dkms and headers ----
step "dpkg -i vtism-guest-dkms (DKMS builds the module for $(uname -r))"
t=$SECONDS
# Its output, each line with the seconds since the start, shows where the time goes.
dpkg -i "$DEBS"/vtism-guest-dkms_*_all.deb 2>&1 | while IFS= read -r l; do echo "   [$((SECONDS - t)) s] $l"; done
[ "${PIPESTATUS[0]}" = 0 ] && pass "dkms: dpkg -i vtism-guest-dkms builds and installs the module" ||
	fail "dkms: dpkg -i vtism-guest-dkms failed"
echo "== DKMS package installed in $((SECONDS - t)) s"
check "dkms: dkms status says installed for $(uname -r)" \
	bash -c "dkms status vtism_guest | tee /dev/stderr | grep -q '$(uname -r).*installed'"
check "dkms: modprobe vtism_guest loads the DKMS-built module" \
	bash -c "modprobe vtism_guest && grep -q '^vtism_guest ' /proc/modules &&
		[ \"\$(modinfo -F vermagic vtism_guest | cut -d' ' -f1)\" = \"$(uname -r)\" ] &&
		echo \"\$(modinfo -n vtism_guest), vermagic \$(modinfo -F vermagic vtism_guest)\""

# ---- a libvirt domain with libvirt's own <shmem>, managed by vtismd from the installed unit ----
step "libvirt: define and start web1"
# The operator's one AppArmor addition (docs/host.md, "libvirt"): Debian's libvirt confines each
# domain's QEMU to what its XML names, and the <qemu:commandline> monitor socket is not among it.
# The second rule lets QEMU read which CPUs each node has, which its preallocation needs with
# <numatune> (recorded below).
cat >>/etc/apparmor.d/local/abstractions/libvirt-qemu <<'AA'
# vtism: QEMU creates vtismd's QMP socket
/run/vtism/qmp/*.qmp rw,
# vtism: preallocation with <numatune> reads the nodes' CPUs
/sys/devices/system/node/node[0-9]*/cpumap r,
AA
check "libvirt: virsh define web1 (ivshmem-plain <shmem>, second QMP monitor)" \
	virsh define "$REPO/tests/packaging/web1.xml"
check "libvirt: virsh start web1" virsh start web1
qemu_pid=$(cat /run/libvirt/qemu/web1.pid 2>/dev/null)
echo "== web1: QEMU pid ${qemu_pid:-none}, user $(ps -o user= -p "${qemu_pid:-1}"), RAM $(ram_nodes "${qemu_pid:-self}")"
ps -o args= -p "${qemu_pid:-1}" | tr ' ' '\n' | grep -E 'shmem|ivshmem|qmp|pc.ram|memory-backend' | sed 's/^/   qemu arg: /'
check "libvirt: the channel /dev/shm/vtism-web1 and the QMP socket exist" \
	wait_for 20 bash -c 'ls -l /dev/shm/vtism-web1 /run/vtism/qmp/web1.qmp'
check "libvirt: web1's RAM is preallocated on DRAM (node 0, its vCPU's)" \
	bash -c "n0=\$(mib_on $qemu_pid 0); echo \"\$(ram_nodes $qemu_pid)\"; [ \"\$n0\" -ge 100 ]"
taints=$(grep -o "tainted: [a-z-]*" /var/log/libvirt/qemu/web1.log | sort -u | tr '\n' ' ')
echo "== libvirt marks web1: ${taints:-nothing}"
[ "${taints% }" = "tainted: custom-argv" ] && pass "libvirt: taints web1 custom-argv (the qemu:commandline monitor), nothing else" ||
	fail "libvirt: web1's taints in /var/log/libvirt/qemu/web1.log: '${taints:-none}', want only custom-argv"
grep -E "tainted|qmp" /var/log/libvirt/qemu/web1.log | head -5

check "libvirt: with the cpumap rule, <numatune> interleave over nodes 0 and 2 preallocates half on each" \
	bash -c 'virsh create "$REPO/tests/packaging/numatune-interleave.xml" >/dev/null &&
		pid=$(cat /run/libvirt/qemu/numatune.pid) && r=$(ram_nodes $pid) && n0=$(mib_on $pid 0) &&
		n2=$(mib_on $pid 2) && virsh destroy numatune >/dev/null && echo "$r" && [ $n0 -ge 8 ] && [ $n2 -ge 8 ]'
journalctl -k --no-pager | grep -i 'apparmor="DENIED"' | sed 's/^/   AppArmor: /' | tail -5

step "vtismd: configure, start from the unit"
# The operator's edit of the conffile: web1's quota, and rounds faster than the 1 s default so
# this test's guest rounds (every 200 ms) are taken promptly.
cat >/etc/vtism/vtismd.toml <<TOML
[daemon]
interval_ms = 300
[discovery]
scan_interval_ms = 500
[channel]
entry_budget = 32768
max_entries = 65536
min_interval_ms = 200
[[vm]]
name = "web1"
fast_quota_mib = 32
TOML
check "vtismd: vtism host --check-config accepts the edited configuration" vtism host --check-config
check "vtismd: systemctl enable --now vtismd" systemctl enable --now vtismd
# The guest: a 16 MiB hot set at 16 MiB, published every 200 ms into libvirt's shmem file.
$H publish /dev/shm/vtism-web1 0x1000+4096 200 >"$OUT/publish.log" 2>&1 &
PUB=$!
check "vtismd: discovers libvirt's web1 and reads its <shmem> channel" \
	wait_for 60 bash -c "vtism ctl status --json | python3 -c \"import json,sys; v=[x for x in json.load(sys.stdin)['vms'] if x['name']=='web1']; assert v and v[0]['rounds_accepted'] > 0, v; print('rounds accepted', v[0]['rounds_accepted'])\""
check "vtismd: web1's cold memory is demoted to node 2 until DRAM holds its 32 MiB quota (numa_maps)" \
	wait_for 120 bash -c "n0=\$(mib_on $qemu_pid 0); n2=\$(mib_on $qemu_pid 2); echo \"\$(ram_nodes $qemu_pid)\"; [ \"\$n0\" -ge 16 ] && [ \"\$n0\" -le 32 ] && [ \"\$n2\" -ge 96 ]"
vtism ctl status | tee "$OUT/status.txt"
# The hot set moves to frames vtismd demoted as cold (at 64 MiB): they must come back to DRAM.
# The promotions are counted from before the move: read after it, the baseline could already
# hold some of them (the publisher switches within 200 ms, while this read takes seconds in TCG).
promoted() { vtism ctl status --json | python3 -c "import json,sys; print([x['promoted_bytes'] for x in json.load(sys.stdin)['vms'] if x['name']=='web1'][0])"; }
p1=$(promoted)
echo "0x4000+4096" >/dev/shm/vtism-web1.spec
check "vtismd: a new hot set among the demoted frames is promoted, fast memory within the quota" \
	wait_for 120 bash -c "p=\$(vtism ctl status --json | python3 -c \"import json,sys; print([x['promoted_bytes'] for x in json.load(sys.stdin)['vms'] if x['name']=='web1'][0])\"); n0=\$(mib_on $qemu_pid 0); echo \"promoted \$(( (p - $p1) >> 20 )) MiB more, \$(ram_nodes $qemu_pid)\"; [ \$((p - $p1)) -ge \$((14 << 20)) ] && [ \"\$n0\" -le 32 ]"
check "vtismd: ctl status shows web1's fast memory within the quota" \
	bash -c "[ \"\$(vtism ctl status --json | python3 -c \"import json,sys; v=[x for x in json.load(sys.stdin)['vms'] if x['name']=='web1'][0]; print(int(16<<20 <= v['fast_bytes'] <= v['quota_bytes'] == 32<<20))\")\" = 1 ]"

step "reload, journal"
sed -i 's/^fast_quota_mib = 32$/fast_quota_mib = 48/' /etc/vtism/vtismd.toml
check "vtismd: systemctl reload applies web1's new 48 MiB quota" bash -c \
	"systemctl reload vtismd && sleep 1 && for i in \$(seq 20); do [ \"\$(vtism ctl status --json | python3 -c \"import json,sys; print([x['quota_bytes'] for x in json.load(sys.stdin)['vms'] if x['name']=='web1'][0])\")\" = $((48 << 20)) ] && exit 0; sleep 0.5; done; exit 1"
# Pool mode: what the operator switches to when VMs should share fast memory by need; it adds
# the pool's metrics, so the dashboard is checked after it.
printf '[pool]\nmode = "pool"\nfast_mib = 96\n' >>/etc/vtism/vtismd.toml
check "vtismd: systemctl reload switches to pool mode, web1's quota within its pool limits" bash -c \
	"systemctl reload vtismd && for i in \$(seq 20); do vtism ctl status --json | python3 -c \"import json,sys; d=json.load(sys.stdin); v=[x for x in d['vms'] if x['name']=='web1'][0]; assert d['pool']['mode']=='pool' and v['quota_min_bytes'] <= v['quota_bytes'] <= v['quota_max_bytes'], v; print('quota', v['quota_bytes']>>20, 'MiB in', v['quota_min_bytes']>>20, '-', v['quota_max_bytes']>>20)\" && exit 0; sleep 0.5; done; exit 1"
step "metrics and the Grafana dashboard"
$H get 127.0.0.1:9464 /metrics >"$OUT/metrics.txt" 2>&1
check "metrics: every metric the Grafana dashboard queries is served by this vtismd" \
	python3 "$REPO/tests/packaging/dashboard_metrics.py" "$DASHBOARD" "$OUT/metrics.txt"

check "vtismd: logs to the journal" bash -c "journalctl -u vtismd --no-pager | tee $OUT/vtismd.journal | grep -q 'web1'"
check "vtismd: the unit's sandbox let it move pages (no permission errors in the journal)" \
	bash -c "! grep -iE 'permission denied|EPERM|EACCES' $OUT/vtismd.journal"

step "host tracking under the unit's sandbox; a killed vtismd's kdamond"
# DAMON on the host for web1 too (a second signal beside its channel): vtismd writes DAMON's
# sysfs files, which the unit's ProtectKernelTunables makes read-only unless it says otherwise.
kdamond() { vtism ctl status --json | python3 -c "import json,sys; k=json.load(sys.stdin)['daemon']['host_kdamond']; print(k['state'], k['kdamond_pid'])"; }
export -f kdamond
printf '[host_tracking]\nmode = "on"\n' >>/etc/vtism/vtismd.toml
check "vtismd: host tracking runs web1's kdamond under the unit's sandbox" bash -c \
	"systemctl reload vtismd && for i in \$(seq 60); do k=\$(kdamond 2>/dev/null); [ \"\${k%% *}\" = running ] && echo \"\$k\" && exit 0; sleep 0.5; done; echo \"\$k\"; exit 1"
pid1=$(systemctl show -p MainPID --value vtismd)
kd1=$(kdamond 2>/dev/null | cut -d' ' -f2)
systemctl kill -s KILL vtismd
# ExecStopPost (vtism host --clean-up) takes the kdamond back; Restart=on-failure starts a new
# vtismd, which runs a kdamond of its own.
check "vtismd: killed with SIGKILL, its kdamond taken back and the restarted vtismd runs its own" \
	wait_for 90 bash -c "p=\$(systemctl show -p MainPID --value vtismd); k=\$(kdamond 2>/dev/null); echo \"pid \$p, kdamond \$k\"; [ \"\$p\" != $pid1 ] && [ \"\$p\" != 0 ] && [ \"\${k%% *}\" = running ] && [ \"\${k#* }\" != '$kd1' ] && [ \"\$(cat /sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds)\" = 1 ]"
check "vtismd: the journal says the killed vtismd's kdamond was taken back" \
	bash -c "journalctl -u vtismd --no-pager | grep 'took back the host kdamond'"

step "removal"
kill $PUB 2>/dev/null
virsh destroy web1 >/dev/null
check "vtismd: dpkg -r stops the daemon and keeps the edited conffile" bash -c '
	dpkg -r vtismd >/dev/null && ! systemctl is-active -q vtismd && [ ! -e /usr/bin/vtism ] &&
	grep -q "fast_quota_mib = 48" /etc/vtism/vtismd.toml && echo stopped, conffile kept'
check "vtismd: dpkg -P removes the conffile" bash -c 'dpkg -P vtismd >/dev/null && [ ! -e /etc/vtism/vtismd.toml ]'
check "dkms: dpkg -r vtism-guest-dkms removes the module from DKMS" bash -c '
	rmmod vtism_guest && dpkg -r vtism-guest-dkms >/dev/null && [ -z "$(dkms status vtism_guest)" ] &&
	! modinfo vtism_guest >/dev/null 2>&1 && echo removed'
step "inner done"
