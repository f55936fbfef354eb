"""Filesystem-semantics checks of a container's root filesystem, printed as a canonical report.

Run inside a container of the fscheck image (the python test image plus the fixture layers of
`integration/tests/fs_semantics.rs`): `python3 fscheck.py`. Every line is `key: value` and says
nothing two correct snapshotters may legitimately differ in (no inode or device numbers, no
unpack times: relations between them instead), so the reports of one image on containerd's
overlayfs snapshotter and on weenv are equal line by line. `T <path> ...` lines describe every
object of the tree; the other lines are the individual checks.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
import sys
import time
from collections.abc import Callable

SKIP = {
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/hostname",
    "/tmp/fscheck",
}
# Times newer than this were made by the unpack or the container (not by the image's tars).
RECENT = time.time() - 2 * 86400
# Implicit directories of the fixture layers (no tar entry: a snapshotter makes them up).
IMPLICIT = ["/fx/imp", "/fx/imp/deep", "/fxx", "/fxx/imp"]

out: list[str] = []


def say(key: str, value: object) -> None:
    out.append(f"{key}: {value}")


def errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


def attempt(fn: Callable[[], object]) -> str:
    try:
        return repr(fn())
    except OSError as e:
        return "error " + errname(e)


def when(ns: int) -> str:
    """A time as the tar gives it, or `recent` for one the unpack or the container made."""
    return "recent" if ns / 1e9 > RECENT else str(ns)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def walk(top: str) -> list[tuple[str, os.DirEntry[str]]]:
    """Every entry under `top` (not following symlinks), depth first, names sorted."""
    found: list[tuple[str, os.DirEntry[str]]] = []
    stack = [top]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.path in SKIP:
                continue
            found.append((e.path, e))
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return found


def tree() -> None:
    """readdir vs stat inode numbers, st_dev, inode uniqueness, hardlinks, and a line per object."""
    root_dev = os.lstat("/").st_dev
    entries = walk("/")
    mismatch: list[str] = []
    devs: set[int] = set()
    by_ino: dict[tuple[int, int], list[str]] = {}
    for p, e in entries:
        st = os.lstat(p)
        if e.inode() != st.st_ino:
            mismatch.append(p)
        devs.add(st.st_dev)
        by_ino.setdefault((st.st_dev, st.st_ino), []).append(p)
        kind = stat.S_IFMT(st.st_mode)
        line = f"T {p} {kind:o} {stat.S_IMODE(st.st_mode):o} {st.st_uid}:{st.st_gid}"
        # A large directory's exact size depends on the filesystem's hash seed (htree).
        size = st.st_size
        if stat.S_ISDIR(st.st_mode):
            size = (
                "one block"
                if size == 4096
                else "several blocks"
                if size > 4096
                else size
            )
        line += f" nlink={st.st_nlink} size={size}"
        if stat.S_ISREG(st.st_mode):
            line += f" blocks={st.st_blocks}"
        if p not in IMPLICIT:
            line += f" mtime={when(st.st_mtime_ns)}"
        # A directory's atime is its last readdir on a relatime filesystem (the unpack's
        # walks on a disk filesystem): only files' atimes are the tar's.
        if not stat.S_ISDIR(st.st_mode):
            same = st.st_atime_ns == st.st_mtime_ns
            line += f" atime={'=mtime' if same else when(st.st_atime_ns)}"
        line += f" ctime>=mtime={st.st_ctime_ns >= st.st_mtime_ns}"
        out.append(line)
    say("readdir-vs-stat entries", len(entries))
    say("readdir-vs-stat mismatches", len(mismatch))
    say("readdir-vs-stat first mismatches", mismatch[:5])
    say("st_dev distinct", len(devs))
    say("st_dev all that of /", devs == {root_dev})
    collisions = [
        ps
        for ps in by_ino.values()
        if len(ps) > 1 and any(not os.path.isfile(p) or os.path.islink(p) for p in ps)
    ]
    say("st_ino shared by non-hardlinks", collisions[:5])
    groups = sorted(sorted(ps) for ps in by_ino.values() if len(ps) > 1)
    say("hardlink groups", len(groups))
    for g in groups:
        nl = {os.lstat(p).st_nlink for p in g}
        say(f"hardlink group {g[0]}", f"{g[1:]} nlink={sorted(nl)}")


def same_ino(a: str, b: str) -> bool:
    return os.lstat(a).st_ino == os.lstat(b).st_ino


def timestamps() -> None:
    for p in ["/fx/plain", "/fx/subsec", "/fx/old", "/fx/dir", "/fxx/attr"]:
        st = os.lstat(p)
        say(f"mtime {p}", st.st_mtime_ns)
        if not stat.S_ISDIR(st.st_mode):
            say(f"atime {p}", st.st_atime_ns)
    for d in IMPLICIT:
        st = os.lstat(d)
        # Entries the tar gives times (an implicit subdirectory's unpack time may be newer).
        given = [os.path.join(d, n) for n in os.listdir(d)]
        newest = max(os.lstat(p).st_mtime_ns for p in given if p not in IMPLICIT)
        say(
            f"implicit {d}",
            f"mode={stat.S_IMODE(st.st_mode):o} owner={st.st_uid}:{st.st_gid}",
        )
        say(f"implicit {d} mtime >= its entries'", st.st_mtime_ns >= newest)
        say(f"implicit {d} atime >= its entries' mtime", st.st_atime_ns >= newest)


def xattrs() -> None:
    for p in [
        "/fx/plain",
        "/fx/dir",
        "/usr/bin/python3",
        "/usr/lib/python3.11/os.py",
        "/fxx/attr",
    ]:
        say(
            f"listxattr {p}",
            attempt(lambda p=p: sorted(os.listxattr(p, follow_symlinks=False))),
        )
    say(
        "listxattr symlink /fx/sym",
        attempt(lambda: os.listxattr("/fx/sym", follow_symlinks=False)),
    )
    say(
        "getxattr /fxx/attr user.fx",
        attempt(lambda: os.getxattr("/fxx/attr", "user.fx")),
    )
    say(
        "getxattr /fxx/attr user.none",
        attempt(lambda: os.getxattr("/fxx/attr", "user.none")),
    )
    # A layer without xattrs: the name is missing (ENODATA on a disk filesystem).
    say(
        "getxattr-missing-errno /fx/plain",
        attempt(lambda: os.getxattr("/fx/plain", "user.none")),
    )


def hardlinks_and_copy_up() -> None:
    a, b, c = "/fx/hl/a", "/fx/hl/b", "/fx/hl2/c"
    say("hardlink nlink a b c", [os.lstat(p).st_nlink for p in (a, b, c)])
    say("hardlink same inode a=b a=c", [same_ino(a, b), same_ino(a, c)])
    ino = os.lstat(a).st_ino
    with open(b, "a") as f:  # copy-up of one name (index=off: the link is broken)
        f.write("more\n")
    say("after copy-up of b: nlink a b c", [os.lstat(p).st_nlink for p in (a, b, c)])
    say("after copy-up of b: same inode a=b a=c", [same_ino(a, b), same_ino(a, c)])
    say("after copy-up of b: a keeps its st_ino", os.lstat(a).st_ino == ino)
    say("after copy-up of b: contents", [read(q).decode() for q in (a, b, c)])
    # Copy-up by a metadata change, then by a write: st_ino and st_dev stay.
    p = "/fx/plain"
    before = os.lstat(p)
    os.chmod(p, 0o600)
    after = os.lstat(p)
    say("chmod copy-up keeps st_ino", before.st_ino == after.st_ino)
    say("chmod copy-up keeps st_dev", before.st_dev == after.st_dev)
    say(
        "chmod copy-up mode mtime",
        f"{stat.S_IMODE(after.st_mode):o} {after.st_mtime_ns}",
    )
    big = "/fx/big"
    before = os.lstat(big)
    with open(big, "r+b") as f:
        f.seek(1 << 20)
        f.write(b"X")
    after = os.lstat(big)
    say("write copy-up keeps st_ino", before.st_ino == after.st_ino)
    say("write copy-up size", after.st_size)
    with open(big, "rb") as f:
        say("write copy-up content", sha(f.read()))


def renames() -> None:
    ino = os.lstat("/fx/ren/a").st_ino
    say("rename lower file", attempt(lambda: os.rename("/fx/ren/a", "/fx/ren/b")))
    say("rename lower file: listing", sorted(os.listdir("/fx/ren")))
    say("rename lower file: keeps st_ino", os.lstat("/fx/ren/b").st_ino == ino)
    say("rename lower file: content", read("/fx/ren/b"))
    say(
        "rename lower file over a lower file",
        attempt(lambda: os.rename("/fx/ren/b", "/fx/ren/c")),
    )
    say("rename lower file over: listing", sorted(os.listdir("/fx/ren")))
    say("rename lower dir", attempt(lambda: os.rename("/fx/rdir", "/fx/rdir2")))
    say(
        "rename lower dir: listing",
        sorted(n for n in os.listdir("/fx") if n.startswith("rdir")),
    )
    os.makedirs("/tmp/fscheck/up/x")
    say(
        "rename upper dir",
        attempt(lambda: os.rename("/tmp/fscheck/up/x", "/tmp/fscheck/up/y")),
    )
    say("unlink lower file", attempt(lambda: os.unlink("/fx/ren/c")))
    say("unlink lower file: listing", sorted(os.listdir("/fx/ren")))
    say("rmdir lower dir with entries", attempt(lambda: os.rmdir("/fx/hl2")))


def upper_dirs() -> None:
    """Directories only the container made (upper only) and copied-up image dirs."""
    os.makedirs("/tmp/fscheck/new/sub/deeper")
    with open("/tmp/fscheck/new/file", "w") as f:
        f.write("x")
    os.makedirs("/usr/share/fscheck-made/d")  # in an image dir: copies up /usr/share
    with open("/usr/lib/python3.11/fscheck_made.py", "w") as f:
        f.write("x = 1\n")
    bad: list[str] = []
    n = 0
    for top in ["/tmp", "/usr/share", "/usr/lib/python3.11"]:
        for p, e in walk(top):
            if e.inode() != os.lstat(p).st_ino:
                bad.append(p)
            n += 1
    # `.` and `..` through readdir of the directory itself (os.scandir hides them).
    for d in [
        "/tmp/fscheck/new/sub",
        "/usr/share/fscheck-made",
        "/fx/imp/deep",
        "/fxx/imp",
    ]:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            st_d = os.fstat(fd)
            st_p = os.stat(os.path.dirname(d))
            names = {e.name: e.inode() for e in os.scandir(os.path.dirname(d))}
            if names.get(os.path.basename(d)) != st_d.st_ino:
                bad.append(d)
            if os.stat(d + "/..").st_ino != st_p.st_ino:
                bad.append(d + "/..")
        finally:
            os.close(fd)
        n += 1
    say("upper and copied-up dirs: entries checked", n)
    say("upper and copied-up dirs: readdir-vs-stat mismatches", bad[:5])


def tmpfile_and_fallocate() -> None:
    for d in ["/tmp", "/usr/lib", "/fx/dir"]:
        try:
            fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
        except OSError as e:
            say(f"O_TMPFILE in {d}", "error " + errname(e))
            continue
        os.write(fd, b"tmpfile")
        st = os.fstat(fd)
        target = f"{d}/fscheck-linked"
        linked = attempt(
            lambda fd=fd, target=target: os.link(
                f"/proc/self/fd/{fd}", target, follow_symlinks=True
            )
        )
        os.close(fd)
        say(f"O_TMPFILE in {d}", f"nlink={st.st_nlink} write ok, linkat: {linked}")
    for p in ["/tmp/fscheck/falloc", "/fx/falloc"]:
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, 1 << 20)
            st = os.fstat(fd)
            say(
                f"fallocate {p}",
                f"size={st.st_size} blocks>=2048={st.st_blocks >= 2048}",
            )
        except OSError as e:
            say(f"fallocate {p}", "error " + errname(e))
        finally:
            os.close(fd)


def mmaps() -> None:
    for p in ["/fx/big", "/fx/mm", "/usr/lib/python3.11/os.py", "/usr/bin/python3"]:
        with open(p, "rb") as f:
            data = f.read()
            f.seek(0)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                say(f"mmap read {p}", f"{sha(m[:])} equals read={m[:] == data}")
    with (
        open("/fx/mm", "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m,
    ):
        m[0:4] = b"PRIV"
        say("mmap private write", bytes(m[0:8]))
    say("mmap private write leaves the file", read("/fx/mm")[:8])
    with open("/fx/mm", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[0:4] = b"SHRD"
        m.flush()
    say("mmap shared write (copy-up)", read("/fx/mm")[:8])


def main() -> None:
    os.makedirs("/tmp/fscheck", exist_ok=True)
    tree()
    timestamps()
    xattrs()
    upper_dirs()
    hardlinks_and_copy_up()
    renames()
    tmpfile_and_fallocate()
    mmaps()
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
