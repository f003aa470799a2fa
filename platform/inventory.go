package platform

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/mem"
)

// Inventory is what this worker tells the engine it holds; the engine
// schedules calls against it. RAMMB is nil where memory cannot be read,
// which the protocol allows.
type Inventory struct {
	CPUs  int  `json:"cpus"`
	GPUs  int  `json:"gpus"`
	RAMMB *int `json:"ram_mb"`
}

// Overrides are the --cpus, --gpus and --ram-mb flags: zero (nil for GPUs)
// means detect, and a flag always wins.
type Overrides struct {
	CPUs  int
	GPUs  *int
	RAMMB int
}

// Machine is where inventory detection reads a machine, so tests can
// point it at fake files and variables. The zero value is not useful; use
// ThisMachine.
type Machine struct {
	Getenv     func(string) string
	DevDir     string // where nvidia device nodes live, normally /dev
	CgroupRoot string // normally /sys/fs/cgroup
	ProcSelf   string // normally /proc/self
	CPUs       func() int
	MemoryMB   func() (int, bool)
}

// ThisMachine reads this machine.
func ThisMachine() Machine {
	return Machine{
		Getenv:     os.Getenv,
		DevDir:     "/dev",
		CgroupRoot: "/sys/fs/cgroup",
		ProcSelf:   "/proc/self",
		CPUs: func() int {
			n, err := cpu.Counts(true)
			if err != nil || n < 1 {
				return 1
			}
			return n
		},
		MemoryMB: func() (int, bool) {
			vm, err := mem.VirtualMemory()
			if err != nil || vm.Total == 0 {
				return 0, false
			}
			return int(vm.Total >> 20), true
		},
	}
}

// DetectInventory is the host's inventory with the flags applied.
func DetectInventory(o Overrides) Inventory {
	return ThisMachine().Inventory(o)
}

// Inventory applies the protocol's order: flags, then what a batch
// scheduler granted (SLURM variables), then what a container may use, then
// the machine.
func (p Machine) Inventory(o Overrides) Inventory {
	inv := Inventory{CPUs: o.CPUs, GPUs: 0}
	if inv.CPUs == 0 {
		inv.CPUs = p.cpus()
	}
	if o.GPUs != nil {
		inv.GPUs = *o.GPUs
	} else {
		inv.GPUs = p.gpus()
	}
	if o.RAMMB > 0 {
		n := o.RAMMB
		inv.RAMMB = &n
	} else if n, ok := p.ramMB(); ok {
		inv.RAMMB = &n
	}
	return inv
}

func (p Machine) cpus() int {
	if n, ok := digits(p.Getenv("SLURM_CPUS_ON_NODE")); ok {
		return n
	}
	n := p.CPUs()
	if limit, ok := p.cgroupCPULimit(); ok && limit < n {
		n = limit
	}
	return n
}

func (p Machine) ramMB() (int, bool) {
	if n, ok := digits(p.Getenv("SLURM_MEM_PER_NODE")); ok {
		return n, true
	}
	n, ok := p.MemoryMB()
	if limit, lok := p.cgroupMemoryLimitMB(); lok && (!ok || limit < n) {
		return limit, true
	}
	return n, ok
}

// gpus counts what this worker was given, else what the machine appears to
// have. No vendor tool is run: a scheduler's grant always wins, since a
// node with eight cards may have granted this job one.
func (p Machine) gpus() int {
	for _, name := range []string{"SLURM_GPUS_ON_NODE", "FLUKSIO_WORKER_GPUS"} {
		if n, ok := digits(p.Getenv(name)); ok {
			return n
		}
	}
	if listed := p.Getenv("SLURM_JOB_GPUS"); strings.TrimSpace(listed) != "" {
		n := 0
		for _, part := range strings.Split(listed, ",") {
			if strings.TrimSpace(part) != "" {
				n++
			}
		}
		return n
	}
	matches, _ := filepath.Glob(filepath.Join(p.DevDir, "nvidia[0-9]*"))
	return len(matches)
}

// digits parses a value made only of ASCII digits (Python's str.isdigit(),
// which the Python agent engines were written for checked): "4G" or "-1"
// is not a count, and the next source is tried.
func digits(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}
