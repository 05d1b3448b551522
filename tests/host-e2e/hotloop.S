/* A guest with no OS and no tracker, for the host e2e's host-tracking check: a multiboot
 * kernel (QEMU -kernel loads it) whose vCPU updates one word of every 4 KiB page of a hot
 * range of its RAM, forever (a GUPS-like hot set). Its accesses are the nested QEMU's own
 * loads and stores to guest RAM, which is what DAMON on the host sees. Protected mode, no
 * paging: addresses are guest-physical.
 * HOT_START and HOT_END (bytes) come from the build: tests/host-e2e/mkpayload.sh. */
	.section .text
	.align 4
multiboot_header:
	.long 0x1BADB002		/* magic */
	.long 0				/* flags: an ELF kernel needs none */
	.long -0x1BADB002		/* checksum */

	.globl _start
_start:
	cli
sweep:
	mov $HOT_START, %eax
page:
	incl (%eax)
	add $4096, %eax
	cmp $HOT_END, %eax
	jb page
	jmp sweep
