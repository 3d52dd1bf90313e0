package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockDataDir takes the data dir for this process: an exclusive advisory
// lock on <dir>/LOCK, held until release (or the process's end: the kernel
// drops it, so a crash leaves nothing to clean up). The instance lock in
// NATS is per name: two processes given one data dir (the same name, or two
// names) would otherwise share one SQLite file and one embedded store, and
// the second would take the name over as if the first had crashed. The
// file holds the holder's pid, for the message.
func lockDataDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, "LOCK")
	// Not through a symbolic link: the pid is written into the file.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock the data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another process (pid %s): every instance needs a --data-dir of its own",
				dir, strings.TrimSpace(string(pid)))
		}
		return nil, fmt.Errorf("lock the data dir: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
