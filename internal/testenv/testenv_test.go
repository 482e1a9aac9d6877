package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
)

func TestBuildBusyboxImageIsReproducible(t *testing.T) {
	a := BuildBusyboxImage(t, t.TempDir(), "bb")
	b := BuildBusyboxImage(t, t.TempDir(), "bb")
	if a.ManifestDigest != b.ManifestDigest {
		t.Fatalf("two builds differ: %s vs %s", a.ManifestDigest, b.ManifestDigest)
	}
	c := BuildBusyboxImage(t, t.TempDir(), "bb", WithFile("/etc/variant", "2"))
	if c.ManifestDigest == a.ManifestDigest {
		t.Fatalf("an extra file did not change the digest %s", a.ManifestDigest)
	}
	hex := strings.TrimPrefix(a.ManifestDigest, "sha256:")
	if filepath.Base(a.ArchivePath) != hex+".tar" {
		t.Errorf("archive %s not named <hex>.tar", a.ArchivePath)
	}
	if a.Reference != "localhost/bb@"+a.ManifestDigest {
		t.Errorf("reference %s", a.Reference)
	}
	if st, err := os.Stat(a.ArchivePath); err != nil || st.Size() != a.SizeBytes {
		t.Errorf("archive size: stat %v, %v; want %d", st, err, a.SizeBytes)
	}
}

// TestContainerdRunsImageAndCleansUp checks the two helpers together: the
// archive imports with its manifest digest as the image target and runs,
// and the daemon's cleanup removes a task left running.
func TestContainerdRunsImageAndCleansUp(t *testing.T) {
	var env *Containerd
	t.Run("run", func(t *testing.T) {
		env = StartContainerd(t)
		img := BuildBusyboxImage(t, t.TempDir(), "bb")
		ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), env.Namespace), time.Minute)
		defer cancel()
		client, err := containerd.New(env.Address)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()

		f, err := os.Open(img.ArchivePath)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		imported, err := client.Import(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(imported) != 1 || imported[0].Target.Digest.String() != img.ManifestDigest {
			t.Fatalf("imported %+v, want one image targeting %s", imported, img.ManifestDigest)
		}
		image := containerd.NewImage(client, imported[0])
		if err := image.Unpack(ctx, ""); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out")
		c, err := client.NewContainer(ctx, "left-running",
			containerd.WithNewSnapshot("left-running", image),
			containerd.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs("sh", "-c", "echo hello; exec sleep 300")))
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.NewTask(ctx, cio.LogFile(out))
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, _ := os.ReadFile(out)
			if strings.Contains(string(b), "hello") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("container output %q", b)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Left running on purpose: cleanup must handle it.
	})
	if env == nil || t.Failed() {
		return
	}
	if _, err := os.Stat(env.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after cleanup (%v)", env.Dir, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", env.Namespace)); !os.IsNotExist(err) {
		t.Errorf("cgroup of namespace %s still exists (%v)", env.Namespace, err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), env.Address) {
			t.Errorf("process %s still serves %s: %q", p, env.Address, b)
		}
	}
}
