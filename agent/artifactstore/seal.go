package artifactstore

import (
	"context"
	"fmt"
	"os"
	"syscall"
)

// seal is a replica file's identity and change times when it was last
// hashed and matched. While the file's stat still equals its seal the
// bytes are the ones hashed: a write changes mtime and ctime, a chmod or
// rename changes ctime, a replacement changes the inode, and the kernel
// sets ctime (a caller cannot set it back). A use checks the seal instead
// of re-hashing tens of GB; Verify re-hashes regardless.
type seal struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`
}

// sealOf stats path.
func sealOf(path string) (seal, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return seal{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return seal{}, fmt.Errorf("artifactstore: no stat of %s on this platform", path)
	}
	return seal{Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size,
		MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano()}, nil
}

// sealHolds reports whether the replica at path is unchanged since m's
// seal was taken, and has the size asked for.
func sealHolds(path string, m meta, size int64) bool {
	if m.Seal == nil || m.SizeBytes != size {
		return false
	}
	now, err := sealOf(path)
	return err == nil && now == *m.Seal && now.Size == size
}

// hashSealed hashes the replica at path and, when it matches digest and the
// file did not change while it was read, returns its seal (else nil).
func hashSealed(ctx context.Context, path, digest string) (ok bool, size int64, sl *seal, err error) {
	before, serr := sealOf(path)
	ok, size, err = hashMatches(ctx, path, digest)
	if err != nil || !ok || serr != nil {
		return ok, size, nil, err
	}
	if after, aerr := sealOf(path); aerr == nil && after == before {
		sl = &after
	}
	return ok, size, sl, nil
}
