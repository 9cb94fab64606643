package memtrim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unmapExecutable advises MADV_DONTNEED on the executable's code, and on
// its other read-only mappings when it is not position-independent. In a
// PIE the dynamic linker may have written relocations into pages it then
// made read-only; those are not the file's, and dropping them would undo
// the relocations, so there only the code is dropped. Code and a fixed
// executable's read-only data are never written: dropped, they read back
// from the file as they were.
func unmapExecutable() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("find the executable: %w", err)
	}
	pie, err := isPIE("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("read the mappings: %w", err)
	}
	var total int64
	for _, line := range strings.Split(string(maps), "\n") {
		// start-end perms offset dev inode path
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		if f[5] != exe || !(f[1] == "r-xp" || (!pie && f[1] == "r--p")) {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		// No readahead into the executable's mappings: a page used again
		// is read alone (see evictExecutable).
		unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_RANDOM)
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); errno != 0 {
			return total, fmt.Errorf("madvise %s: %w", f[0], errno)
		}
		total += int64(end - start)
	}
	evictExecutable(exe)
	return total, nil
}

// evictExecutable drops the executable's pages that no process maps from
// the page cache. While they are cached, a fault on one page of a mapping
// maps the cached pages around it too (the kernel's fault-around, 64 KiB):
// the few code and read-only data pages an idle agent uses would bring
// back most of what was unmapped. Evicted, a page used again is read from
// the file alone (the mappings are MADV_RANDOM: no readahead). Pages
// still mapped, by this process or another, stay.
func evictExecutable(exe string) {
	f, err := os.Open(exe)
	if err != nil {
		return
	}
	defer f.Close()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// isPIE reports whether the ELF file at path is position-independent
// (type ET_DYN) rather than fixed (ET_EXEC).
func isPIE(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("read the executable: %w", err)
	}
	defer f.Close()
	var h [18]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return false, fmt.Errorf("read the executable's ELF header: %w", err)
	}
	if !bytes.Equal(h[:4], []byte("\x7fELF")) {
		return false, fmt.Errorf("the executable is not ELF")
	}
	var order binary.ByteOrder = binary.LittleEndian
	if h[5] == 2 {
		order = binary.BigEndian
	}
	switch t := order.Uint16(h[16:]); t {
	case 2: // ET_EXEC
		return false, nil
	case 3: // ET_DYN
		return true, nil
	default:
		return false, fmt.Errorf("the executable's ELF type is %d", t)
	}
}

// threadCount is the number of the process's OS threads, 0 when it
// cannot be read.
func threadCount() int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	return len(tasks)
}
