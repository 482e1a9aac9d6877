package disk

import (
	"syscall"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// Measure measures the filesystem holding root (the runtime's content). An
// unset root, or one statfs cannot read, is stated unknown.
func Measure(root string, log *zap.Logger) schemas.DiskFacts {
	if root == "" {
		return schemas.DiskFacts{}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		log.Warn("content root not measurable; disk stated unknown", zap.String("content_root", root), zap.Error(err))
		return schemas.DiskFacts{}
	}
	// Block counts are in fragment-size units; bsize is only a hint.
	unit := st.Frsize
	if unit <= 0 {
		unit = st.Bsize
	}
	// Bavail, not Bfree: blocks reserved for root are not ours to promise.
	return schemas.DiskFacts{Known: true, TotalBytes: int64(st.Blocks) * unit, FreeBytes: int64(st.Bavail) * unit}
}

// sameFilesystem says whether both paths are on one filesystem; false when
// either cannot be read.
func sameFilesystem(a, b string) bool {
	var sa, sb syscall.Stat_t
	if syscall.Stat(a, &sa) != nil || syscall.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev
}
