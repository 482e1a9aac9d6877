//go:build !cgo

package nvml

// A build without cgo cannot dlopen NVML: it could not look, so every probe
// states nothing established (never "no driver", which would be a guess).
func systemLibrary(string) library { return noCgo{} }

type noCgo struct{}

func (noCgo) Init() nvmlReturn                        { return errFunctionNotFound }
func (noCgo) Shutdown() nvmlReturn                    { return errUninitialized }
func (noCgo) DriverVersion() (string, nvmlReturn)     { return "", errUninitialized }
func (noCgo) CUDADriverVersion() (int, nvmlReturn)    { return 0, errUninitialized }
func (noCgo) DeviceCount() (int, nvmlReturn)          { return 0, errUninitialized }
func (noCgo) Device(int) (string, uint64, nvmlReturn) { return "", 0, errUninitialized }
func (noCgo) Describe(nvmlReturn) string              { return "this build has no cgo, so it cannot load NVML" }
