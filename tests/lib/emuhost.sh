# The emulated DRAM+CXL host that tests/host-e2e and tests/packaging boot under TCG, as QEMU
# options: two sockets with a CPU and 1 GiB of DRAM each (nodes 0 and 1), and a CPU-less 2 GiB
# node 2 that ACPI SLIT/HMAT describe as slower ("CXL"): 2 GiB so that the host e2e can reserve
# a 1 GiB hugetlbfs page there at boot (its vm-j) and still have a GiB for its other VMs. QEMU's
# TCG host backs only the pages the emulated host touches. Sourced by bash: sets emuhost_machine.
# EMUHOST_TWO_CXL=1 (the host e2e) adds a second CXL expander, CPU-less node 3 (512 MiB, as slow
# as node 2 and a little farther), and a second CPU on node 0 (CPU 2, its own package), so that
# two slow nodes can promote into node 0 at once, as in seed 002's double-promote experiment.
emuhost_two_cxl=${EMUHOST_TWO_CXL:-0}
emuhost_node0_more_cpus=""
[ "$emuhost_two_cxl" != 1 ] || emuhost_node0_more_cpus=",cpus=2"
emuhost_machine=(-accel tcg,thread=multi -machine q35,hmat=on -cpu max)
if [ "$emuhost_two_cxl" = 1 ]; then
	emuhost_machine+=(-smp 3,sockets=3 -m 4608M)
else
	emuhost_machine+=(-smp 2,sockets=2 -m 4G)
fi
emuhost_machine+=(
	-object memory-backend-ram,size=1G,id=m0 -object memory-backend-ram,size=1G,id=m1
	-object memory-backend-ram,size=2G,id=m2
	-numa "node,nodeid=0,cpus=0${emuhost_node0_more_cpus},memdev=m0"
	-numa node,nodeid=1,cpus=1,memdev=m1 -numa node,nodeid=2,memdev=m2,initiator=0
	-numa dist,src=0,dst=1,val=21 -numa dist,src=0,dst=2,val=24 -numa dist,src=1,dst=2,val=32
)
if [ "$emuhost_two_cxl" = 1 ]; then
	emuhost_machine+=(
		-object memory-backend-ram,size=512M,id=m3 -numa node,nodeid=3,memdev=m3,initiator=0
		-numa dist,src=0,dst=3,val=26 -numa dist,src=1,dst=3,val=34 -numa dist,src=2,dst=3,val=40
	)
fi
# hmat-lb INITIATOR TARGET LATENCY BANDWIDTH
emuhost_lb() {
	emuhost_machine+=(
		-numa "hmat-lb,initiator=$1,target=$2,hierarchy=memory,data-type=access-latency,latency=$3"
		-numa "hmat-lb,initiator=$1,target=$2,hierarchy=memory,data-type=access-bandwidth,bandwidth=$4")
}
emuhost_lb 0 0 10 10G
emuhost_lb 0 1 20 5G
emuhost_lb 0 2 80 2G
emuhost_lb 1 0 20 5G
emuhost_lb 1 1 10 10G
emuhost_lb 1 2 100 1G
if [ "$emuhost_two_cxl" = 1 ]; then
	emuhost_lb 0 3 80 2G
	emuhost_lb 1 3 100 1G
fi
