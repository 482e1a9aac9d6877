package testenv

import (
	"os"
	"os/exec"
	"testing"

	"github.com/warmfleet/warmfleet/internal/ociimage"
)

// Image is an OCI image archive written by BuildBusyboxImage.
type Image = ociimage.Image

// ImageOption varies the built image.
type ImageOption func(map[string]string)

// WithFile adds a regular file (an absolute path in the image) with the given
// content, e.g. to build a second image with a different digest.
func WithFile(name, content string) ImageOption {
	return func(files map[string]string) { files[name] = content }
}

// BuildBusyboxImage builds a one-layer OCI image holding the host's static
// busybox (see ociimage.BuildBusybox) into dir. It skips t when
// /bin/busybox is missing, and fails t instead when CI is set.
func BuildBusyboxImage(t testing.TB, dir, name string, opts ...ImageOption) Image {
	t.Helper()
	if _, err := os.Stat(ociimage.BusyboxPath); err != nil {
		unavailable(t, "%s missing (%v): apt-get install -y busybox-static", ociimage.BusyboxPath, err)
	}
	files := map[string]string{}
	for _, o := range opts {
		o(files)
	}
	img, err := ociimage.BuildBusybox(dir, name, files)
	if err != nil {
		t.Fatalf("testenv: build busybox image: %v", err)
	}
	return img
}

// BuildHostImage builds an image of host programs with every library they
// load (ociimage.BuildFromHost, ociimage.WithLibraries): /bin/sh, and the
// extra programs given, with the host's glibc. It skips t (fails under CI)
// when ldd is missing.
func BuildHostImage(t testing.TB, dir, name string, programs ...string) Image {
	t.Helper()
	if _, err := exec.LookPath("ldd"); err != nil {
		unavailable(t, "ldd not found: cannot list a program's libraries")
	}
	files, err := ociimage.WithLibraries(append([]string{"/bin/sh"}, programs...)...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	img, err := ociimage.BuildFromHost(dir, name, files)
	if err != nil {
		t.Fatalf("testenv: build host image: %v", err)
	}
	return img
}
