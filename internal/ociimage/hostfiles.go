package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
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
	return buildImage(dir, name, layer)
}

// hostTar is the layer: the usual top-level directories, every parent
// directory of the files, and the files.
func hostTar(files map[string][]byte, modes map[string]int64) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]int64{"bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o755, "sys": 0o755, "tmp": 0o1777}
	for name := range files {
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	entries := make([]*tar.Header, 0, len(dirs)+len(files))
	for d, mode := range dirs {
		entries = append(entries, &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode})
	}
	for name, data := range files {
		if _, isDir := dirs[name]; isDir {
			return nil, fmt.Errorf("ociimage: %s is both a file and a directory", name)
		}
		entries = append(entries, &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: modes[name], Size: int64(len(data))})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	for _, h := range entries {
		h.ModTime = fixedTime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(files[h.Name]); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
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
