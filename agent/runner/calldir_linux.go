package runner

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// noXattrs reports whether path has no extended attribute at all, as most
// call directories: one look says so. Where it has some (an SELinux
// label), the ACLs are looked for one by one.
func noXattrs(path string) bool {
	n, err := unix.Llistxattr(path, nil)
	return err == nil && n == 0
}

// list lists the directory, st, through listing, opened the first time.
func (d *callDir) list(st *unix.Stat_t) ([]string, error) {
	if !d.listed {
		fd, err := unix.Open(d.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		var opened unix.Stat_t
		if err := unix.Fstat(fd, &opened); err != nil || opened.Dev != st.Dev || opened.Ino != st.Ino {
			unix.Close(fd)
			return nil, fmt.Errorf("%s changed while it was being emptied", d.path)
		}
		d.listing, d.listed, d.dev, d.ino = fd, true, uint64(st.Dev), st.Ino
	} else if _, err := unix.Seek(d.listing, 0, 0); err != nil {
		return nil, err
	}
	var names []string
	var buf [2048]byte
	for {
		n, err := unix.Getdents(d.listing, buf[:])
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
