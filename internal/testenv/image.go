package testenv

import (
	"os"
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
