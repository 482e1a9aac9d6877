// Package nvml measures a host's NVIDIA cards through NVML, by way of
// github.com/NVIDIA/go-nvml's nvml.Interface: the system library in
// cmd/warmfleet-gpu-probe, go-nvml's pkg/nvml/mock servers (e.g.
// mock/dgxa100) in tests.
//
// What it states follows the Established rule of schemas.AcceleratorFacts:
// a host where libnvidia-ml cannot be loaded looked and found no driver
// (Established, no vendor); a host whose NVML failed in any other way could
// not look (not Established); a working NVML gives vendor "nvidia", the
// driver version, the CUDA driver API version the driver supports, the cards
// grouped by model and memory (Devices), and each card by index (Cards): its
// UUID, model, memory, MIG mode and MIG instances, and health (pending
// retired pages, pending or failed row remapping, XID critical errors raised
// while the probe watched). CDI names are not NVML's to know: the agent adds
// them (adapters/gpuprobe).
//
// # Why a probe binary, and why only it links this package
//
// go-nvml leaves every NVML symbol undefined in the binary and relies on
// lazy binding. A Go program that links the stdlib plugin package is linked
// with -z now (BIND_NOW), and containerd's client links it, so an agent
// holding both dies at exec on every host without the driver ("symbol
// lookup error"; /work/shared/DESIGN.md, "Facts checked"). The agent used to
// dodge that by binding nine NVML entry points by hand with dlopen. Card
// identities, MIG (device handles, GetMigMode, GetMigDeviceHandleByIndex,
// GPU and compute instance profiles) and health (retired pages, remapped
// rows, XID events) need several times as many, each with its own structs
// and versioned names, which is a lot of hand-written ABI to get wrong in a
// process that must not crash. So the measuring lives here on go-nvml, and
// only cmd/warmfleet-gpu-probe links it: a small binary without containerd,
// where go-nvml answers ERROR_LIBRARY_NOT_FOUND cleanly on a host without
// the driver. The agent runs that binary with a timeout and reads its JSON
// (adapters/gpuprobe), so a driver that hangs, or a symbol an old driver
// lacks, costs one report, never the agent. Entry points that old drivers
// lack are looked up (ExtendedInterface.LookupSymbol) before they are
// called, since calling a missing lazily bound symbol kills the process.
//
// The package must never be imported by the agent or anything that links
// containerd; cmd/warmfleet-gpu-probe's tests check both binaries' imports.
package nvml
