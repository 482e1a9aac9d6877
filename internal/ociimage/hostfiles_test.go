package ociimage

import (
	"os/exec"
	"slices"
	"testing"
)

func TestBuildFromHost_ShellWithItsLibraries(t *testing.T) {
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("no ldd here")
	}
	files, err := WithLibraries("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, "/bin/sh") || len(files) < 2 {
		t.Fatalf("WithLibraries(/bin/sh) = %v, want the shell and its libc", files)
	}
	dir := t.TempDir()
	a, err := BuildFromHost(dir, "host", files)
	if err != nil {
		t.Fatal(err)
	}
	b, err := BuildFromHost(t.TempDir(), "host", files)
	if err != nil {
		t.Fatal(err)
	}
	if a.ManifestDigest != b.ManifestDigest || a.SizeBytes == 0 {
		t.Fatalf("two builds of the same files differ: %s vs %s", a.ManifestDigest, b.ManifestDigest)
	}
	if _, err := BuildFromHost(dir, "host", []string{"relative"}); err == nil {
		t.Fatal("a relative path was accepted")
	}
	if _, err := BuildFromHost(dir, "host", []string{"/"}); err == nil {
		t.Fatal("a directory was accepted")
	}
}
