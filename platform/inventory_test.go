package platform

import (
	"os"
	"path/filepath"
	"testing"
)

// The machine every fake probe pretends to be: 64 logical CPUs and
// 256000 MiB of memory, so a container or scheduler limit below that shows.
const (
	machineCPUs = 64
	machineMB   = 256000
)

// fakeHost is a Machine over real files in temporary directories.
type fakeHost struct {
	t    *testing.T
	env  map[string]string
	dev  string
	root string // the cgroup mount
	proc string // /proc/self
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	base := t.TempDir()
	h := &fakeHost{
		t:    t,
		env:  map[string]string{},
		dev:  filepath.Join(base, "dev"),
		root: filepath.Join(base, "cgroup"),
		proc: filepath.Join(base, "proc-self"),
	}
	for _, dir := range []string{h.dev, h.root, h.proc} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func (h *fakeHost) probe() Machine {
	return Machine{
		Getenv:     func(k string) string { return h.env[k] },
		DevDir:     h.dev,
		CgroupRoot: h.root,
		ProcSelf:   h.proc,
		CPUs:       func() int { return machineCPUs },
		MemoryMB:   func() (int, bool) { return machineMB, true },
	}
}

// write puts content at rel under dir, creating parents.
func (h *fakeHost) write(dir, rel, content string) {
	h.t.Helper()
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// gpuNodes creates the device nodes of a two-GPU machine: only nvidia0
// and nvidia1 are cards; the control and UVM nodes are not.
func (h *fakeHost) gpuNodes() {
	for _, name := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
		h.write(h.dev, name, "")
	}
	if err := os.MkdirAll(filepath.Join(h.dev, "nvidia-caps"), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

// cgroupV2 lays out a unified hierarchy with this process at path.
func (h *fakeHost) cgroupV2(path, cpuMax, memoryMax string) {
	h.write(h.proc, "cgroup", "0::"+path+"\n")
	if cpuMax != "" {
		h.write(h.root, filepath.Join(path, "cpu.max"), cpuMax+"\n")
	}
	if memoryMax != "" {
		h.write(h.root, filepath.Join(path, "memory.max"), memoryMax+"\n")
	}
}

// cgroupV1 lays out a legacy hierarchy the way Docker and systemd mount it:
// cpu,cpuacct and memory controllers, cpu a symlink to cpu,cpuacct.
func (h *fakeHost) cgroupV1(path, quota, period, memLimit string) {
	h.write(h.proc, "cgroup", "12:memory:"+path+"\n"+
		"11:cpu,cpuacct:"+path+"\n"+
		"5:devices:"+path+"\n"+
		"1:name=systemd:"+path+"\n")
	cpuDir := filepath.Join("cpu,cpuacct", path)
	h.write(h.root, filepath.Join(cpuDir, "cpu.cfs_quota_us"), quota+"\n")
	h.write(h.root, filepath.Join(cpuDir, "cpu.cfs_period_us"), period+"\n")
	if err := os.Symlink("cpu,cpuacct", filepath.Join(h.root, "cpu")); err != nil {
		h.t.Fatal(err)
	}
	h.write(h.root, filepath.Join("memory", path, "memory.limit_in_bytes"), memLimit+"\n")
}

func ramOf(inv Inventory) any {
	if inv.RAMMB == nil {
		return nil
	}
	return *inv.RAMMB
}

func checkInventory(t *testing.T, got Inventory, cpus, gpus int, ram any) {
	t.Helper()
	if got.CPUs != cpus || got.GPUs != gpus || ramOf(got) != ram {
		t.Errorf("inventory = {cpus %d, gpus %d, ram_mb %v}, want {cpus %d, gpus %d, ram_mb %v}",
			got.CPUs, got.GPUs, ramOf(got), cpus, gpus, ram)
	}
}

func intp(n int) *int { return &n }

func TestInventoryBareMachine(t *testing.T) {
	h := newFakeHost(t)
	checkInventory(t, h.probe().Inventory(Overrides{}), machineCPUs, 0, machineMB)
}

func TestInventoryCountsOnlyNumberedNvidiaNodes(t *testing.T) {
	h := newFakeHost(t)
	h.gpuNodes()
	checkInventory(t, h.probe().Inventory(Overrides{}), machineCPUs, 2, machineMB)
}

func TestInventoryMissingDevDirMeansNoGPUs(t *testing.T) {
	h := newFakeHost(t)
	p := h.probe()
	p.DevDir = filepath.Join(h.dev, "absent")
	checkInventory(t, p.Inventory(Overrides{}), machineCPUs, 0, machineMB)
}

func TestInventoryUnreadableMemoryIsNull(t *testing.T) {
	h := newFakeHost(t)
	p := h.probe()
	p.MemoryMB = func() (int, bool) { return 0, false }
	checkInventory(t, p.Inventory(Overrides{}), machineCPUs, 0, nil)
}

func TestInventoryCgroupV2(t *testing.T) {
	const gib4 = "4294967296"
	tests := []struct {
		name              string
		path              string
		cpuMax, memoryMax string
		cpus              int
		ram               any
	}{
		{"two CPUs and 4 GiB", "/", "200000 100000", gib4, 2, 4096},
		{"a fraction of a CPU rounds up", "/", "150000 100000", "max", 2, machineMB},
		{"no CPU limit", "/", "max 100000", gib4, machineCPUs, 4096},
		{"no memory limit", "/", "200000 100000", "max", 2, machineMB},
		{"limits above the machine are ignored", "/", "12800000 100000", "1099511627776000", machineCPUs, machineMB},
		{"nested cgroup path", "/system.slice/fluksio-worker.service", "300000 100000", "1073741824", 3, 1024},
		{"no limit files at all", "/", "", "", machineCPUs, machineMB},
		{"garbage in the files", "/", "lots", "plenty", machineCPUs, machineMB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.cgroupV2(tt.path, tt.cpuMax, tt.memoryMax)
			checkInventory(t, h.probe().Inventory(Overrides{}), tt.cpus, 0, tt.ram)
		})
	}
}

// Inside a container /proc/self/cgroup often names the host's path while
// the limits sit at the container's mount root.
func TestInventoryCgroupV2LimitsAtMountRoot(t *testing.T) {
	h := newFakeHost(t)
	h.write(h.proc, "cgroup", "0::/kubepods/burstable/pod1234/abcdef\n")
	h.write(h.root, "cpu.max", "400000 100000\n")
	h.write(h.root, "memory.max", "2147483648\n")
	checkInventory(t, h.probe().Inventory(Overrides{}), 4, 0, 2048)
}

func TestInventoryCgroupV1(t *testing.T) {
	tests := []struct {
		name                    string
		quota, period, memLimit string
		cpus                    int
		ram                     any
	}{
		{"three CPUs and 8 GiB", "300000", "100000", "8589934592", 3, 8192},
		{"no quota (-1)", "-1", "100000", "8589934592", machineCPUs, 8192},
		{"no memory limit (a huge number)", "300000", "100000", "9223372036854771712", 3, machineMB},
		{"limits above the machine are ignored", "12800000", "100000", "549755813888000", machineCPUs, machineMB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.cgroupV1("/docker/0123456789ab", tt.quota, tt.period, tt.memLimit)
			checkInventory(t, h.probe().Inventory(Overrides{}), tt.cpus, 0, tt.ram)
		})
	}
}

// Inside a v1 container the cgroup file names the host's path, which does
// not exist in the container's own mount; the controller's root holds the
// limits.
func TestInventoryCgroupV1LimitsAtControllerRoot(t *testing.T) {
	h := newFakeHost(t)
	h.write(h.proc, "cgroup", "12:memory:/docker/0123\n11:cpu,cpuacct:/docker/0123\n")
	h.write(h.root, "cpu,cpuacct/cpu.cfs_quota_us", "200000\n")
	h.write(h.root, "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
	if err := os.Symlink("cpu,cpuacct", filepath.Join(h.root, "cpu")); err != nil {
		t.Fatal(err)
	}
	h.write(h.root, "memory/memory.limit_in_bytes", "1073741824\n")
	checkInventory(t, h.probe().Inventory(Overrides{}), 2, 0, 1024)
}

func TestInventoryCgroupLimitWithoutMachineMemory(t *testing.T) {
	h := newFakeHost(t)
	h.cgroupV2("/", "", "1073741824")
	p := h.probe()
	p.MemoryMB = func() (int, bool) { return 0, false }
	checkInventory(t, p.Inventory(Overrides{}), machineCPUs, 0, 1024)
}

func TestInventorySLURM(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		cpus int
		gpus int
		ram  any
	}{
		{"nothing set", nil, 2, 2, 4096},
		{"SLURM grants beat the cgroup and the machine",
			map[string]string{"SLURM_CPUS_ON_NODE": "8", "SLURM_MEM_PER_NODE": "16000"}, 8, 2, 16000},
		{"non-numeric SLURM values are ignored",
			map[string]string{"SLURM_CPUS_ON_NODE": "8(x2)", "SLURM_MEM_PER_NODE": "16G"}, 2, 2, 4096},
		{"a number with blanks is not numeric",
			map[string]string{"SLURM_CPUS_ON_NODE": " 8", "SLURM_MEM_PER_NODE": "-1"}, 2, 2, 4096},
		{"SLURM_GPUS_ON_NODE first",
			map[string]string{"SLURM_GPUS_ON_NODE": "1", "FLUKSIO_WORKER_GPUS": "4", "SLURM_JOB_GPUS": "0,1,2"}, 2, 1, 4096},
		{"then FLUKSIO_WORKER_GPUS",
			map[string]string{"SLURM_GPUS_ON_NODE": "gpu:1", "FLUKSIO_WORKER_GPUS": "4", "SLURM_JOB_GPUS": "0,1,2"}, 2, 4, 4096},
		{"FLUKSIO_WORKER_GPUS 0 means none",
			map[string]string{"FLUKSIO_WORKER_GPUS": "0", "SLURM_JOB_GPUS": "0,1,2"}, 2, 0, 4096},
		{"then the SLURM_JOB_GPUS entries",
			map[string]string{"FLUKSIO_WORKER_GPUS": "all", "SLURM_JOB_GPUS": "0,1,2"}, 2, 3, 4096},
		{"blank SLURM_JOB_GPUS entries do not count",
			map[string]string{"SLURM_JOB_GPUS": "3, ,7,"}, 2, 2, 4096},
		{"a blank SLURM_JOB_GPUS falls back to the device nodes",
			map[string]string{"SLURM_JOB_GPUS": " "}, 2, 2, 4096},
		{"SLURM_JOB_GPUS beats the device nodes",
			map[string]string{"SLURM_JOB_GPUS": "5"}, 2, 1, 4096},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.gpuNodes()
			h.cgroupV2("/", "200000 100000", "4294967296")
			for k, v := range tt.env {
				h.env[k] = v
			}
			checkInventory(t, h.probe().Inventory(Overrides{}), tt.cpus, tt.gpus, tt.ram)
		})
	}
}

func TestInventoryFlagsWin(t *testing.T) {
	h := newFakeHost(t)
	h.gpuNodes()
	h.cgroupV2("/", "200000 100000", "4294967296")
	h.env["SLURM_CPUS_ON_NODE"] = "8"
	h.env["SLURM_MEM_PER_NODE"] = "16000"
	h.env["SLURM_GPUS_ON_NODE"] = "1"
	p := h.probe()

	checkInventory(t, p.Inventory(Overrides{CPUs: 3, GPUs: intp(5), RAMMB: 1000}), 3, 5, 1000)
	// --gpus 0 is an answer, not "detect".
	checkInventory(t, p.Inventory(Overrides{GPUs: intp(0)}), 8, 0, 16000)
	// Absent flags detect.
	checkInventory(t, p.Inventory(Overrides{}), 8, 1, 16000)
}
