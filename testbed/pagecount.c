// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * A QEMU TCG plugin that counts the guest's data accesses (loads and stores) per 4 KiB frame of
 * guest-physical memory: the bake-off's ground truth for workloads that print no map of their hot
 * pages (a real server program). The counters live in a shared file (one little-endian u64 per
 * frame, frame n at offset 8n), cumulative from boot, so the reader takes differences between two
 * looks; nothing is reset and nothing is locked (one vCPU writes, the reader tolerates a count
 * one access behind).
 *
 *   qemu-system-x86_64 ... -plugin /path/libpagecount.so,counts=/dev/shm/counts,frames=65536
 *
 * Instruction fetches are not counted, and neither are accesses to device memory (MMIO).
 * Built against qemu-plugin.h from Debian's QEMU source (testbed/prepare.sh --bakeoff).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static uint64_t *counts;
static uint64_t frames;

static void on_access(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *udata)
{
	struct qemu_plugin_hwaddr *hw = qemu_plugin_get_hwaddr(info, vaddr);
	uint64_t frame;

	(void)vcpu;
	(void)udata;
	if (!hw || qemu_plugin_hwaddr_is_io(hw))
		return;
	frame = qemu_plugin_hwaddr_phys_addr(hw) >> 12;
	if (frame < frames)
		counts[frame]++;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	size_t n = qemu_plugin_tb_n_insns(tb);

	(void)id;
	for (size_t i = 0; i < n; i++)
		qemu_plugin_register_vcpu_mem_cb(qemu_plugin_tb_get_insn(tb, i), on_access,
						 QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW, NULL);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
					   char **argv)
{
	const char *path = NULL;
	int fd;

	(void)info;
	for (int i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "counts=", 7))
			path = argv[i] + 7;
		else if (!strncmp(argv[i], "frames=", 7))
			frames = strtoull(argv[i] + 7, NULL, 0);
		else {
			fprintf(stderr, "pagecount: unknown argument %s (counts=PATH,frames=N)\n", argv[i]);
			return -1;
		}
	}
	if (!path || !frames) {
		fprintf(stderr, "pagecount: needs counts=PATH and frames=N\n");
		return -1;
	}
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || ftruncate(fd, (off_t)(frames * 8))) {
		perror("pagecount: counts file");
		return -1;
	}
	counts = mmap(NULL, frames * 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (counts == MAP_FAILED) {
		perror("pagecount: mmap");
		return -1;
	}
	qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
	return 0;
}
