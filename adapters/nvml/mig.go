package nvml

import (
	"math"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// migDevices lists the MIG instances of a MIG-enabled card, by the MIG
// device index NVML gives them (the index nvidia-ctk's CDI names use:
// "<card>:<index>"). An instance that cannot be read is left out: it cannot
// be booked.
func (r *reader) migDevices(dev nvml.Device, cardMemory int64, log *zap.Logger) []schemas.MIGDevice {
	for _, sym := range []string{"nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceById"} {
		if !r.has(sym) {
			log.Warn("NVML lacks a MIG entry point; MIG instances not listed", zap.String("symbol", sym))
			return nil
		}
	}
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		log.Warn("NVML MIG device count", zap.Error(fail("max mig device count", ret)))
		return nil
	}
	var out []schemas.MIGDevice
	for j := range max {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			log.Warn("NVML MIG device unreadable", zap.Int("mig_index", j), zap.Error(fail("mig device handle", ret)))
			continue
		}
		m, err := r.migDevice(dev, mig, j, cardMemory)
		if err != nil {
			log.Warn("NVML MIG device unreadable", zap.Int("mig_index", j), zap.Error(err))
			continue
		}
		out = append(out, m)
	}
	return out
}

func (r *reader) migDevice(parent, mig nvml.Device, j int, cardMemory int64) (schemas.MIGDevice, error) {
	uuid, ret := mig.GetUUID()
	if ret != nvml.SUCCESS {
		return schemas.MIGDevice{}, fail("mig device uuid", ret)
	}
	gi, ret := mig.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return schemas.MIGDevice{}, fail("mig gpu instance id", ret)
	}
	ci, ret := mig.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return schemas.MIGDevice{}, fail("mig compute instance id", ret)
	}
	m := schemas.MIGDevice{Index: j, UUID: uuid, GPUInstanceID: gi, ComputeInstanceID: ci}
	if mem, ret := mig.GetMemoryInfo(); ret == nvml.SUCCESS {
		m.MemoryBytes = int64(mem.Total)
	}
	if p, err := profileName(parent, gi, ci, cardMemory); err == nil {
		m.Profile = p
	} else {
		r.log.Debug("NVML MIG profile unknown", zap.Int("mig_index", j), zap.Error(err))
	}
	return m, nil
}

// profileName names a MIG instance the way nvidia-smi does: "<g>g.<mem>gb"
// for a GPU instance of g slices used whole, "<c>c.<g>g.<mem>gb" for a
// compute instance of c slices in it, with the profile's suffix (+me, -me,
// +me.all, +gfx).
func profileName(parent nvml.Device, giID, ciID int, cardMemory int64) (string, error) {
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return "", fail("gpu instance by id", ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return "", fail("gpu instance info", ret)
	}
	// GetInfo names the profile by its id; the profile list is by index.
	giIndex, giProfile := -1, nvml.GpuInstanceProfileInfo{}
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := parent.GetGpuInstanceProfileInfo(p)
		if ret == nvml.SUCCESS && info.Id == giInfo.ProfileId {
			giIndex, giProfile = p, info
			break
		}
	}
	if giIndex < 0 {
		return "", errNoProfile
	}
	name := strconv.Itoa(int(giProfile.SliceCount)) + "g." + strconv.FormatUint(migMemoryGB(uint64(cardMemory), giProfile.MemorySizeMB), 10) + "gb"
	if ciSlices, ok := computeSlices(gi, ciID); ok && ciSlices != giProfile.SliceCount {
		name = strconv.Itoa(int(ciSlices)) + "c." + name
	}
	return name + profileSuffix(giIndex), nil
}

// computeSlices is the slice count of compute instance ciID in gi.
func computeSlices(gi nvml.GpuInstance, ciID int) (uint32, bool) {
	ci, ret := gi.GetComputeInstanceById(ciID)
	if ret != nvml.SUCCESS {
		return 0, false
	}
	info, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, false
	}
	for p := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		pi, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && pi.Id == info.ProfileId {
			return pi.SliceCount, true
		}
	}
	return 0, false
}

// migMemoryGB rounds a MIG profile's memory the way NVIDIA names profiles:
// its share of the card rounded up to eighths, times the card's memory in
// whole GiB (so 4864 MiB of a 40 GiB A100 is "5gb").
func migMemoryGB(cardBytes, profileMB uint64) uint64 {
	const gib = 1 << 30
	if cardBytes == 0 {
		return (profileMB + 1023) / 1024
	}
	share := float64(profileMB<<20) / float64(cardBytes)
	share = math.Ceil(share*8) / 8
	return uint64(math.Round(share * float64((cardBytes+gib-1)/gib)))
}

// profileSuffix is the name suffix of a GPU instance profile index.
func profileSuffix(index int) string {
	switch index {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+gfx"
	}
	return ""
}
