// Package ociimage builds small OCI images without a registry or a Docker
// daemon: a static busybox in one layer, written as an OCI image-layout tar
// that containerd imports. Tests and `make run` use it, since no registry is
// reachable from CI.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// Applets get a symlink to busybox in the image's /bin. A fixed list (not
// `busybox --list`) keeps the image the same across busybox builds.
var applets = []string{
	"[", "ash", "awk", "cat", "cp", "date", "dd", "echo", "env", "false",
	"grep", "head", "hostname", "id", "kill", "ls", "mkdir", "mv", "printf",
	"ps", "pwd", "rm", "sed", "seq", "sh", "sleep", "tail", "tee", "test",
	"touch", "tr", "true", "uname", "wc", "yes",
}

// fixedTime stamps every tar entry so builds are byte-for-byte reproducible.
var fixedTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Image is an OCI image archive written by BuildBusybox.
type Image struct {
	// Reference is "localhost/<name>@sha256:<hex>".
	Reference string
	// ManifestDigest is the image manifest's digest, "sha256:<hex>". The
	// archive's index.json points straight at the manifest, so this is also
	// the target digest containerd records when it imports the archive.
	ManifestDigest string
	// ArchivePath is the OCI image-layout tar, named <hex>.tar.
	ArchivePath string
	// SizeBytes is the archive's size.
	SizeBytes int64
}

// BuildBusybox builds a one-layer OCI image holding the host's static
// busybox, with Cmd ["/bin/sh"] and any extra files (absolute path →
// content; a different file gives a different digest), and writes it as an
// OCI image-layout tar named <hex>.tar into dir. The same inputs always give
// the same digest.
func BuildBusybox(dir, name string, files map[string]string) (Image, error) {
	clean := map[string]string{}
	for p, c := range files {
		clean[strings.TrimPrefix(path.Clean("/"+p), "/")] = c
	}
	return buildBusyboxImage(dir, name, imageConfig{files: clean})
}

// BuildBusyboxFor is BuildBusybox with a config and manifest that name
// another platform. The content is still the host's busybox: such an image
// is pulled or listed in an index, never run.
func BuildBusyboxFor(dir, name string, files map[string]string, platform ocispec.Platform) (Image, error) {
	clean := map[string]string{}
	for p, c := range files {
		clean[strings.TrimPrefix(path.Clean("/"+p), "/")] = c
	}
	return buildBusyboxImage(dir, name, imageConfig{files: clean, platform: &platform})
}

type imageConfig struct {
	files    map[string]string
	platform *ocispec.Platform // nil: linux and the host's architecture
}

// blob is one content-addressed file of the layout.
type blob struct {
	desc ocispec.Descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	return blob{
		desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))},
		data: data,
	}
}

func buildBusyboxImage(dir, name string, cfg imageConfig) (Image, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return Image{}, err
	}
	layerTar, err := rootfsTar(bin, cfg.files)
	if err != nil {
		return Image{}, err
	}
	platform := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if cfg.platform != nil {
		platform = *cfg.platform
	}
	return buildImage(dir, name, layerTar, platform)
}

// buildImage writes the one-layer image of layerTar as an OCI image-layout
// archive into dir.
func buildImage(dir, name string, layerTar []byte, platform ocispec.Platform) (Image, error) {
	layerGz, err := gzipBytes(layerTar)
	if err != nil {
		return Image{}, err
	}
	layer := newBlob(ocispec.MediaTypeImageLayerGzip, layerGz)

	config, err := jsonBlob(ocispec.MediaTypeImageConfig, ocispec.Image{
		Platform: platform,
		Config: ocispec.ImageConfig{
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cmd: []string{"/bin/sh"},
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar)}},
	})
	if err != nil {
		return Image{}, err
	}
	manifest, err := jsonBlob(ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config.desc,
		Layers:    []ocispec.Descriptor{layer.desc},
	})
	if err != nil {
		return Image{}, err
	}

	mdesc := manifest.desc
	mdesc.Platform = &platform
	mdesc.Annotations = map[string]string{
		// Lets a human `ctr images import` the archive under a tag; the
		// runtime adapter names images by their pinned reference instead.
		"io.containerd.image.name": "localhost/" + name + ":latest",
		ocispec.AnnotationRefName:  "latest",
	}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{mdesc},
	})
	if err != nil {
		return Image{}, err
	}

	hex := manifest.desc.Digest.Encoded()
	archivePath := filepath.Join(dir, hex+".tar")
	size, err := writeLayout(archivePath, index, []blob{layer, config, manifest})
	if err != nil {
		return Image{}, err
	}
	return Image{
		Reference:      "localhost/" + name + "@" + manifest.desc.Digest.String(),
		ManifestDigest: manifest.desc.Digest.String(),
		ArchivePath:    archivePath,
		SizeBytes:      size,
	}, nil
}

func jsonBlob(mediaType string, v any) (blob, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return blob{}, err
	}
	return newBlob(mediaType, data), nil
}

// rootfsTar is the layer: /bin/busybox, its applet symlinks, the usual
// top-level directories and any extra files.
func rootfsTar(busybox []byte, files map[string]string) ([]byte, error) {
	entries := make(map[string]layerFile, len(files)+1)
	entries["bin/busybox"] = layerFile{data: busybox, mode: 0o755}
	for name, content := range files {
		entries[name] = layerFile{data: []byte(content), mode: 0o644}
	}
	links := make(map[string]string, len(applets))
	for _, a := range applets {
		links["bin/"+a] = "busybox"
	}
	return layerTar(entries, links)
}

// layerFile is one regular file of a layer.
type layerFile struct {
	data []byte
	mode int64
}

// layerTar is a layer of the usual top-level directories, every parent
// directory of the files, the files and the symlinks (name → target), in
// name order with fixed times, so equal input gives equal bytes.
func layerTar(files map[string]layerFile, links map[string]string) ([]byte, error) {
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
	entries := make([]*tar.Header, 0, len(dirs)+len(links)+len(files))
	for d, mode := range dirs {
		entries = append(entries, &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode})
	}
	for name, target := range links {
		entries = append(entries, &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
	}
	for name, f := range files {
		if _, isDir := dirs[name]; isDir {
			return nil, fmt.Errorf("ociimage: %s is both a file and a directory", name)
		}
		entries = append(entries, &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.mode, Size: int64(len(f.data))})
	}
	// Parents sort before children, and map order must not leak into bytes.
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	for _, h := range entries {
		h.ModTime = fixedTime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(files[h.Name].data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gzipBytes wraps data in gzip with a zero header time so output is
// reproducible. Stored (uncompressed) blocks: compressing costs seconds per
// image under -race, and archive size does not matter to tests.
func gzipBytes(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.NoCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeLayout writes an OCI image-layout tar atomically (temp file + rename),
// so a reader never sees a half-written archive under its final name.
func writeLayout(dst string, index []byte, blobs []blob) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".layout-*.tmp")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	add := func(name string, data []byte) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: fixedTime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return 0, err
	}
	if err := add(ocispec.ImageLayoutFile, layout); err != nil {
		return 0, err
	}
	if err := add("index.json", index); err != nil {
		return 0, err
	}
	for _, b := range blobs {
		if err := add(path.Join("blobs", b.desc.Digest.Algorithm().String(), b.desc.Digest.Encoded()), b.data); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return 0, fmt.Errorf("rename archive into place: %w", err)
	}
	return size, nil
}
