package platform

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Container limits. A worker in a container with a CPU quota of two cores
// on a 64-core host must not advertise 64: the engine would send it work
// that then runs at a thirtieth of the expected speed, or is OOM-killed.

// cgroupCPULimit returns the CPU quota in whole CPUs (rounded up), for
// cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us / cpu.cfs_period_us).
func (p Machine) cgroupCPULimit() (int, bool) {
	if dir, ok := p.cgroupDir("", "cpu.max"); ok {
		fields := strings.Fields(readTrim(filepath.Join(dir, "cpu.max")))
		if len(fields) == 2 && fields[0] != "max" {
			return quotaCPUs(fields[0], fields[1])
		}
		return 0, false
	}
	if dir, ok := p.cgroupDir("cpu", "cpu.cfs_quota_us"); ok {
		return quotaCPUs(readTrim(filepath.Join(dir, "cpu.cfs_quota_us")), readTrim(filepath.Join(dir, "cpu.cfs_period_us")))
	}
	return 0, false
}

func quotaCPUs(quota, period string) (int, bool) {
	q, err1 := strconv.ParseFloat(quota, 64)
	per, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || q <= 0 || per <= 0 {
		return 0, false
	}
	return int(math.Ceil(q / per)), true
}

// cgroupMemoryLimitMB returns the memory limit in MiB for cgroup v2
// (memory.max) or v1 (memory.limit_in_bytes; v1 reports "no limit" as a
// huge number, which the comparison with physical memory then ignores).
func (p Machine) cgroupMemoryLimitMB() (int, bool) {
	var raw string
	if dir, ok := p.cgroupDir("", "memory.max"); ok {
		raw = readTrim(filepath.Join(dir, "memory.max"))
	} else if dir, ok := p.cgroupDir("memory", "memory.limit_in_bytes"); ok {
		raw = readTrim(filepath.Join(dir, "memory.limit_in_bytes"))
	}
	n, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	mb := n >> 20
	if mb > math.MaxInt32 {
		return 0, false
	}
	return int(mb), true
}

// cgroupDir finds this process's cgroup directory holding file. controller
// "" means the unified (v2) hierarchy. Inside a container the path in
// /proc/self/cgroup is often "/" while the limits sit at the mount root, so
// both are tried.
func (p Machine) cgroupDir(controller, file string) (string, bool) {
	f, err := os.Open(filepath.Join(p.ProcSelf, "cgroup"))
	if err != nil {
		return "", false
	}
	defer f.Close()
	var candidates []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			candidates = append(candidates, filepath.Join(p.CgroupRoot, parts[2]))
		}
		if controller != "" {
			for _, c := range strings.Split(parts[1], ",") {
				if c == controller {
					candidates = append(candidates,
						filepath.Join(p.CgroupRoot, parts[1], parts[2]),
						filepath.Join(p.CgroupRoot, controller, parts[2]))
				}
			}
		}
	}
	if controller == "" {
		candidates = append(candidates, p.CgroupRoot)
	} else {
		candidates = append(candidates, filepath.Join(p.CgroupRoot, controller))
	}
	for _, dir := range candidates {
		if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
			return dir, true
		}
	}
	return "", false
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
