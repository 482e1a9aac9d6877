package testenv

import (
	"os"
	"os/exec"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/internal/ociimage"
	"github.com/warmfleet/warmfleet/schemas"
)

// Image is an OCI image archive written by BuildBusyboxImage.
type Image = ociimage.Image

// ImageOption varies the built image.
type ImageOption func(*imageOptions)

type imageOptions struct {
	files    map[string]string
	platform *schemas.Platform
}

// WithFile adds a regular file (an absolute path in the image) with the given
// content, e.g. to build a second image with a different digest.
func WithFile(name, content string) ImageOption {
	return func(o *imageOptions) { o.files[name] = content }
}

// WithPlatform makes the image's config and manifest name platform p. The
// content stays the host's busybox: such an image is pulled, never run.
func WithPlatform(p schemas.Platform) ImageOption {
	return func(o *imageOptions) { o.platform = &p }
}

// BuildBusyboxImage builds a one-layer OCI image holding the host's static
// busybox (see ociimage.BuildBusybox) into dir. It skips t when
// /bin/busybox is missing, and fails t instead when CI is set.
func BuildBusyboxImage(t testing.TB, dir, name string, opts ...ImageOption) Image {
	t.Helper()
	if _, err := os.Stat(ociimage.BusyboxPath); err != nil {
		unavailable(t, "%s missing (%v): apt-get install -y busybox-static", ociimage.BusyboxPath, err)
	}
	o := imageOptions{files: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	var img Image
	var err error
	if p := o.platform; p != nil {
		img, err = ociimage.BuildBusyboxFor(dir, name, o.files, ocispec.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant})
	} else {
		img, err = ociimage.BuildBusybox(dir, name, o.files)
	}
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
