"""The seccomp filter of every sandbox: a classic-BPF program bwrap loads (``--seccomp FD``) before the code runs.

Generated code needs files, sockets, threads and processes; it never needs the kernel's rarer
and riskier surfaces. The filter makes these fail with ``EPERM`` (a clean error, never a kill):

* keyrings (``keyctl``, ``add_key``, ``request_key``): no reading or planting keys;
* other processes' memory (``ptrace``, ``process_vm_readv``/``writev``);
* attack surface that has carried many kernel exploits: ``io_uring_*``, ``userfaultfd``,
  ``bpf``, ``perf_event_open``;
* namespaces and mounts (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag, ``mount``,
  ``umount2``, ``pivot_root``, ``chroot``, the new mount API);
* the machine itself (``kexec_*``, module loading and unloading, ``reboot``, ``swapon``/``off``,
  ``acct``, ``quotactl``, ``syslog``);
* the newest mount API calls (``open_tree_attr``, ``listmount``, ``statmount``) and other rarely needed
  surfaces: another process's descriptors (``pidfd_getfd``), ``memfd_secret``, ``kcmp``,
  ``process_madvise``, the x86 LDT (``modify_ldt``), and ``personality`` other than the default persona
  (``PER_LINUX``, 0) or the query (``0xffffffff``);
* socket families other than ``AF_UNIX``, ``AF_INET`` and ``AF_INET6`` (``socket`` answers
  ``EAFNOSUPPORT``): ``AF_VSOCK`` reaches the host's hypervisor whatever the network namespace, ``AF_NETLINK``
  the kernel's routing and audit interfaces; the bundled scenario and the AWM-1K samples need none (glibc's
  ``getaddrinfo`` falls back without netlink).

``clone3`` answers ``ENOSYS`` (its flags live in memory a filter cannot read; the C library then
falls back to ``clone``, whose flags it can), as Docker's default profile does. A system call of
another ABI (i386 or x32 on x86_64, arm32 on aarch64) is denied whole: the numbers differ there.

The program is assembled here (no library): the instruction set used is five opcodes, and the
tests run it through an interpreter against the kernel headers' system-call numbers.
"""

from __future__ import annotations

import errno
import platform
import struct

# architecture (platform.machine()) -> AUDIT_ARCH_* value the kernel puts in seccomp_data.arch
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

#: name -> (x86_64 number, aarch64 number): arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h
DENIED: dict[str, tuple[int, int]] = {
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "userfaultfd": (323, 282),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "syslog": (103, 116),
    # x86_64 syscall_64.tbl / asm-generic numbers since Linux 6.8 (statmount, listmount) and 6.15 (open_tree_attr)
    "statmount": (457, 457),
    "listmount": (458, 458),
    "open_tree_attr": (467, 467),
    "pidfd_getfd": (438, 438),
    "memfd_secret": (447, 447),
    "process_madvise": (440, 440),
    "kcmp": (312, 272),
    "modify_ldt": (154, -1),  # x86 only
}
#: personality(persona): only these personas pass (the default, and 0xffffffff, which only asks)
PERSONALITY = (135, 92)
PERSONAS_ALLOWED = (0x0, 0xFFFFFFFF)
#: socket(family, ...): only these families pass (AF_UNIX, AF_INET, AF_INET6); others answer EAFNOSUPPORT
SOCKET = (41, 198)
SOCKET_FAMILIES = (1, 2, 10)
CLONE = (56, 220)
CLONE3 = (435, 435)
# CLONE_NEW{TIME, NS, CGROUP, UTS, IPC, USER, PID, NET}
CLONE_NEW_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16  # struct seccomp_data (little-endian: arg0's low word at 16)


class UnsupportedArchitecture(ValueError):
    """No filter for this machine: the system-call numbers are known for x86_64 and aarch64 only."""


def machine(name: str | None = None) -> str:
    """The architecture the filter is for: ``x86_64`` or ``aarch64`` (else :class:`UnsupportedArchitecture`)."""
    arch = (name or platform.machine()).lower()
    arch = ARCH_ALIASES.get(arch, arch)
    if arch not in AUDIT_ARCH:
        raise UnsupportedArchitecture(f"no seccomp filter for the {arch} architecture (only x86_64 and aarch64)")
    return arch


def syscall_number(name: str, arch: str | None = None) -> int:
    """The number of a system call the filter names, on ``arch`` (default: this machine)."""
    index = 0 if machine(arch) == "x86_64" else 1
    table = {**DENIED, "clone": CLONE, "clone3": CLONE3, "personality": PERSONALITY, "socket": SOCKET}
    return table[name][index]


def program(arch: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions, jumps resolved (offsets count from the next one)."""
    arch = machine(arch)
    index = 0 if arch == "x86_64" else 1
    # Symbolic program: ("ld", offset) | ("jeq"/"jge"/"jset", k, true_label, false_label) | ("ret", k) | label str
    code: list = [("ld", OFFSET_ARCH), ("jeq", AUDIT_ARCH[arch], "native", "deny"), "native", ("ld", OFFSET_NR)]
    if arch == "x86_64":
        code.append(("jge", X32_SYSCALL_BIT, "deny", None))
    for nr in sorted({v[index] for v in DENIED.values()} - {-1}):
        code.append(("jeq", nr, "deny", None))
    code += [
        ("jeq", CLONE3[index], "nosys", None),
        ("jeq", PERSONALITY[index], "personality", None),
        ("jeq", SOCKET[index], "socket", None),
        ("jeq", CLONE[index], "clone", "allow"),
        "clone",
        ("ld", OFFSET_ARG0),
        ("jset", CLONE_NEW_FLAGS, "deny", "allow"),
        "personality",
        ("ld", OFFSET_ARG0),
        *(("jeq", persona, "allow", None) for persona in PERSONAS_ALLOWED),
        ("ret", RET_ERRNO | errno.EPERM),
        "socket",
        ("ld", OFFSET_ARG0),
        *(("jeq", family, "allow", None) for family in SOCKET_FAMILIES),
        ("ret", RET_ERRNO | errno.EAFNOSUPPORT),
        "allow",
        ("ret", RET_ALLOW),
        "deny",
        ("ret", RET_ERRNO | errno.EPERM),
        "nosys",
        ("ret", RET_ERRNO | errno.ENOSYS),
    ]
    labels, position = {}, 0
    for item in code:
        if isinstance(item, str):
            labels[item] = position
        else:
            position += 1
    out, position = [], 0
    for item in code:
        if isinstance(item, str):
            continue
        position += 1
        op = item[0]
        if op == "ld":
            out.append((LD_W_ABS, 0, 0, item[1]))
        elif op == "ret":
            out.append((RET_K, 0, 0, item[1]))
        else:
            jt, jf = (0 if label is None else labels[label] - position for label in item[2:])
            assert 0 <= jt < 256 and 0 <= jf < 256, "jump out of range"
            out.append(({"jeq": JEQ_K, "jge": JGE_K, "jset": JSET_K}[op], jt, jf, item[1]))
    return out


def program_bytes(arch: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]`` bytes (what ``bwrap --seccomp FD`` reads)."""
    return b"".join(struct.pack("=HBBI", *insn) for insn in program(arch))


def evaluate(insns: list[tuple[int, int, int, int]], nr: int, arch_value: int, arg0: int = 0) -> int:
    """Run the filter on one system call (a classic-BPF interpreter for the opcodes above); returns its verdict."""
    data = struct.pack("<iI", nr, arch_value & 0xFFFFFFFF) + b"\0" * 8 + struct.pack("<Q", arg0) + b"\0" * 40
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == RET_K:
            return k
        elif code in (JEQ_K, JGE_K, JSET_K):
            hit = {JEQ_K: acc == k, JGE_K: acc >= k, JSET_K: bool(acc & k)}[code]
            pc += jt if hit else jf
        else:
            raise ValueError(f"unknown opcode {code:#x}")
