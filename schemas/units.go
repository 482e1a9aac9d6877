package schemas

import "fmt"

// FormatBytes writes a byte count in binary units, as operators read it.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// String is the byte counts shown in events and `run get`, after What.
func (p TransferProgress) String() string {
	if pct := p.Percent(); pct >= 0 {
		return fmt.Sprintf("%s of %s (%.0f%%)", FormatBytes(p.DoneBytes), FormatBytes(p.TotalBytes), pct)
	}
	return FormatBytes(p.DoneBytes)
}
