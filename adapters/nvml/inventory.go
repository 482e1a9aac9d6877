package nvml

import "strconv"

// cudaCapability formats NVML's CUDA driver version (1000*major + 10*minor,
// e.g. 12040) as "12.4"; "" for a value NVML should never give.
func cudaCapability(v int) string {
	if v <= 0 {
		return ""
	}
	return strconv.Itoa(v/1000) + "." + strconv.Itoa(v%1000/10)
}
