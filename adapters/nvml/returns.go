package nvml

import "strconv"

// nvmlReturn is NVML's nvmlReturn_t. Only the codes this package branches
// on or names are listed; any other is reported by number and NVML's text.
type nvmlReturn int32

const (
	success             nvmlReturn = 0
	errUninitialized    nvmlReturn = 1
	errNotSupported     nvmlReturn = 3
	errNoPermission     nvmlReturn = 4
	errDriverNotLoaded  nvmlReturn = 9
	errLibraryNotFound  nvmlReturn = 12 // also what this package states when dlopen fails
	errFunctionNotFound nvmlReturn = 13 // also what it states for a symbol the library lacks
	errGPUIsLost        nvmlReturn = 15
	errUnknown          nvmlReturn = 999
)

// String names the codes this package knows without asking NVML.
func (r nvmlReturn) String() string {
	switch r {
	case success:
		return "SUCCESS"
	case errUninitialized:
		return "ERROR_UNINITIALIZED"
	case errNotSupported:
		return "ERROR_NOT_SUPPORTED"
	case errNoPermission:
		return "ERROR_NO_PERMISSION"
	case errDriverNotLoaded:
		return "ERROR_DRIVER_NOT_LOADED"
	case errLibraryNotFound:
		return "ERROR_LIBRARY_NOT_FOUND"
	case errFunctionNotFound:
		return "ERROR_FUNCTION_NOT_FOUND"
	case errGPUIsLost:
		return "ERROR_GPU_IS_LOST"
	case errUnknown:
		return "ERROR_UNKNOWN"
	}
	return "NVML return " + strconv.Itoa(int(r))
}
