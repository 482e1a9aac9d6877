package ociimage

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BuildFromHost builds a one-layer OCI image holding host files, each at
// its own absolute path in the image, with Cmd ["/bin/sh"], and writes it
// into dir like BuildBusybox. A symlink is followed and its target's bytes
// stored as a regular file (mode kept), so "/bin/sh" and the libraries a
// dynamically linked program needs (ldd lists them) arrive whatever links
// the host uses. It makes images for programs a CDI spec mounts from the
// host, such as nvidia-smi, which need the host's glibc (busybox-static
// has none). The same files always give the same digest.
func BuildFromHost(dir, name string, paths []string) (Image, error) {
	files := map[string][]byte{}
	modes := map[string]int64{}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return Image{}, fmt.Errorf("ociimage: %q is not an absolute path", p)
		}
		st, err := os.Stat(p)
		if err != nil {
			return Image{}, fmt.Errorf("ociimage: %w", err)
		}
		if !st.Mode().IsRegular() {
			return Image{}, fmt.Errorf("ociimage: %s is not a regular file", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return Image{}, fmt.Errorf("ociimage: %w", err)
		}
		name := strings.TrimPrefix(path.Clean(filepath.ToSlash(p)), "/")
		files[name], modes[name] = data, int64(st.Mode().Perm())
	}
	layer, err := hostTar(files, modes)
	if err != nil {
		return Image{}, err
	}
	return buildImage(dir, name, layer, ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH})
}

// hostTar is the layer: the usual top-level directories, every parent
// directory of the files, and the files with their modes.
func hostTar(files map[string][]byte, modes map[string]int64) ([]byte, error) {
	entries := make(map[string]layerFile, len(files))
	for name, data := range files {
		entries[name] = layerFile{data: data, mode: modes[name]}
	}
	return layerTar(entries, nil)
}

// WithLibraries is paths and every shared library ldd says they load,
// without repeats, sorted: what BuildFromHost needs to run them. A static
// program adds nothing.
func WithLibraries(paths ...string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, p := range paths {
		add(p)
		b, err := exec.Command("ldd", p).CombinedOutput()
		if err != nil {
			if strings.Contains(string(b), "not a dynamic executable") {
				continue
			}
			return nil, fmt.Errorf("ociimage: ldd %s: %w: %s", p, err, strings.TrimSpace(string(b)))
		}
		for _, line := range strings.Split(string(b), "\n") {
			// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
			// "/lib64/ld-linux-x86-64.so.2 (0x…)"; the vdso has no path.
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
				add(f[2])
			case len(f) >= 1 && filepath.IsAbs(f[0]):
				add(f[0])
			case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
				return nil, fmt.Errorf("ociimage: %s needs %s, which is not found", p, f[0])
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
