package nspawn

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// machineCgroups makes the machine's own cgroups: one named for it under
// this process's cgroup in each hierarchy systemd tracks processes by (the
// cgroup v2 one and, on a hybrid or v1 host, the name=systemd one), so
// that machines booted by tests at once, and the tests' own processes,
// never share a cgroup. shared: other machines may have made them and run
// in them already (Options.Cgroup).
func machineCgroups(name string, shared bool) ([]string, error) {
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var made []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, after := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(after) < 3 || fields[3] != "/" {
			continue
		}
		var hierarchy string
		switch {
		case after[0] == "cgroup2":
		case after[0] == "cgroup" && slices.Contains(strings.Split(after[2], ","), "name=systemd"):
			hierarchy = "name=systemd"
		default:
			continue
		}
		path, ok := own[hierarchy]
		if !ok || seen[hierarchy] {
			continue // not this process's hierarchy, or one mounted twice
		}
		seen[hierarchy] = true
		dir := filepath.Join(fields[4], path, "fluksio-nspawn-"+name)
		if err := os.Mkdir(dir, 0o755); err != nil && !(shared && errors.Is(err, fs.ErrExist)) {
			for _, d := range made {
				os.Remove(d)
			}
			return nil, fmt.Errorf("boot: making the machine's cgroup: %w", err)
		}
		made = append(made, dir)
	}
	if len(made) == 0 {
		return nil, errors.New("boot: no cgroup hierarchy to give the machine a cgroup of its own in")
	}
	return made, nil
}

// ownCgroups is this process's cgroup by hierarchy: "" for cgroup v2,
// else the v1 hierarchy's controllers ("name=systemd").
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			own[parts[1]] = parts[2]
		}
	}
	return own, nil
}

// removeCgroup removes a machine's cgroup once it has powered off, with
// the cgroups its systemd left under it, deepest first. Processes that
// outlived the machine are killed (cgroup v2's cgroup.kill).
func removeCgroup(dir string) error {
	dirs := cgroupsUnder(dir)
	os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		for _, d := range dirs {
			if e := os.Remove(d); e != nil && !errors.Is(e, fs.ErrNotExist) {
				err = e
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("removing the machine's cgroup %s: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeSharedCgroup removes what of a cgroup that machines share no
// machine uses any more: the last machine to power off removes all of it.
// A cgroup whose last process just exited may refuse (EBUSY) for a moment.
func removeSharedCgroup(dir string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy := false
		for _, d := range cgroupsUnder(dir) {
			if err := os.Remove(d); errors.Is(err, syscall.EBUSY) && !populated(d) {
				busy = true
			}
		}
		if !busy || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// populated reports whether a process runs in the cgroup dir or under it
// (cgroup v2; a v1 cgroup says nothing, and counts as empty).
func populated(dir string) bool {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return strings.Contains(string(b), "populated 1")
}

// cgroupsUnder lists dir and the cgroups under it, deepest first.
func cgroupsUnder(dir string) []string {
	var dirs []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	slices.Reverse(dirs)
	return dirs
}
