// Package nvml measures a host's NVIDIA cards through NVML. It implements
// agent.AcceleratorProbe, and Fake stands in for it on machines without GPUs.
//
// What it states follows the Established rule of schemas.AcceleratorFacts:
// a host where libnvidia-ml cannot be loaded looked and found no driver
// (Established, no vendor); a host whose NVML failed in any other way could
// not look (not Established); a working NVML gives vendor "nvidia", the
// driver version, the CUDA driver API version the driver supports, and the
// cards grouped by model and memory, without UUIDs.
//
// It binds the nine NVML entry points it uses with dlopen and dlsym rather
// than through github.com/NVIDIA/go-nvml: go-nvml's bindings leave every
// NVML symbol undefined in the binary and rely on lazy binding, and a Go
// program that links the stdlib plugin package (containerd's client does) is
// linked with -z now, so the agent would die at exec on every host without
// the driver ("symbol lookup error", go-nvml issue #18).
package nvml
