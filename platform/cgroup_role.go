package platform

// CgroupRole is what a cgroup of the worker's is made for, which its name
// says, so that an operator reading systemd-cgls tells a call from a warm
// process waiting for one: call-…, spare-…, zygote-…. A cgroup keeps the
// name it was made with: cgroup v2 refuses to rename one (EPERM: only v1
// has a rename), and moving a spare's process into a cgroup named for its
// call when it is handed one waits for the kernel's RCU, on the call's
// path (12 ms for one move, measured on a busy two-core machine; a call
// forked from a zygote takes under 2 ms in all). So a spare's cgroup is named
// spare-… for its life, the call it serves included; its process says
// what it does now (the runtime's process title).
type CgroupRole uint8

const (
	CgroupCall   CgroupRole = iota // a call's runner, started or forked for it
	CgroupSpare                    // a spare, started or forked ahead of its call
	CgroupZygote                   // a zygote, which forks spares and serves no call
)

var cgroupRoles = [...]string{CgroupCall: "call", CgroupSpare: "spare", CgroupZygote: "zygote"}

func (r CgroupRole) String() string { return cgroupRoles[r] }
