// Package platform is what differs by machine: the inventory advertised to
// the engine (CPUs, GPUs, memory, honouring batch schedulers and container
// limits), finding and checking the user's Python, process groups, and the
// CUDA device mask.
package platform
