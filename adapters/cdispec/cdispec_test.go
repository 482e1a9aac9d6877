package cdispec

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/internal/testenv"
)

func baseSpec() *specs.Spec {
	return &specs.Spec{Process: &specs.Process{Env: []string{"PATH=/bin"}}, Linux: &specs.Linux{
		Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}}}
}

func TestScan_ListsDevicesAndReportsMalformedSpecs(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	bad := testenv.WriteMalformedCDISpec(t, gpus.Dir)
	missing := filepath.Join(t.TempDir(), "absent")
	r := New([]string{missing, gpus.Dir}, zaptest.NewLogger(t))
	got := r.Scan()
	want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", gpus.ByUUID(0), gpus.ByUUID(1), "nvidia.com/gpu=all"}
	slices.Sort(want)
	if !got.Scanned || !reflect.DeepEqual(got.Devices, want) || !reflect.DeepEqual(got.SpecDirs, []string{missing, gpus.Dir}) {
		t.Fatalf("Scan = %+v, want devices %v from both dirs", got, want)
	}
	if len(got.Errors) != 1 || got.Errors[0].Path != bad || got.Errors[0].Reason == "" || len(got.Errors[0].Reason) > maxReason+len("…") {
		t.Fatalf("errors %+v, want one for %s with a short reason", got.Errors, bad)
	}
	if strings.Contains(got.Errors[0].Reason, bad) {
		t.Errorf("reason repeats the path: %q", got.Errors[0].Reason)
	}
	t.Logf("malformed spec reported as %q", got.Errors[0].Reason)
}

func TestScan_UnreadableDirIsReported(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := New([]string{notDir}, zaptest.NewLogger(t)).Scan()
	if len(got.Devices) != 0 || len(got.Errors) != 1 || got.Errors[0].Path != notDir {
		t.Fatalf("Scan = %+v, want one error for %s", got, notDir)
	}
}

func TestScan_SeesASpecWrittenLater(t *testing.T) {
	dir := t.TempDir()
	r := New([]string{dir}, zaptest.NewLogger(t))
	if got := r.Scan(); len(got.Devices) != 0 {
		t.Fatalf("empty dir offers %v", got.Devices)
	}
	gpus := testenv.WriteCDIGPUs(t)
	data, err := os.ReadFile(filepath.Join(gpus.Dir, "nvidia.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := r.Scan(); len(got.Devices) != 5 {
		t.Fatalf("after writing a spec: %v", got.Devices)
	}
	s := baseSpec()
	if err := r.Inject(s, []string{gpus.ByIndex(1)}); err != nil {
		t.Fatalf("Inject after the spec appeared: %v", err)
	}
}

func TestInject_AppliesDeviceAndSpecEdits(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	testenv.WriteMalformedCDISpec(t, gpus.Dir) // does not stop the valid spec
	r := New([]string{gpus.Dir}, zaptest.NewLogger(t))
	s := baseSpec()
	if err := r.Inject(s, []string{gpus.ByUUID(1)}); err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != 1 {
		t.Fatalf("devices %+v, want only /dev/nvidia1", s.Linux.Devices)
	}
	d := s.Linux.Devices[0]
	if d.Path != "/dev/nvidia1" || d.Type != "c" || d.Major != 1 || d.Minor != 3 {
		t.Fatalf("device %+v, want /dev/nvidia1 c 1:3", d)
	}
	for _, e := range []string{"NVIDIA_VISIBLE_DEVICES=1", "WARMFLEET_CDI_SPEC=fake-gpus", "PATH=/bin"} {
		if !slices.Contains(s.Process.Env, e) {
			t.Errorf("env %v lacks %s", s.Process.Env, e)
		}
	}
	allowed := false
	for _, rule := range s.Linux.Resources.Devices {
		allowed = allowed || (rule.Allow && rule.Type == "c" && rule.Major != nil && *rule.Major == 1 && rule.Minor != nil && *rule.Minor == 3)
	}
	if !allowed {
		t.Errorf("cgroup rules %+v do not allow c 1:3", s.Linux.Resources.Devices)
	}

	both := baseSpec()
	if err := r.Inject(both, []string{gpus.ByIndex(0), gpus.ByIndex(1)}); err != nil {
		t.Fatal(err)
	}
	if len(both.Linux.Devices) != 2 {
		t.Fatalf("two devices injected as %+v", both.Linux.Devices)
	}
}

func TestInject_RefusesWhatItCannotResolve(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	bad := testenv.WriteMalformedCDISpec(t, gpus.Dir)
	r := New([]string{gpus.Dir}, zaptest.NewLogger(t))

	s := baseSpec()
	err := r.Inject(s, []string{gpus.ByIndex(0), "nvidia.com/gpu=7"})
	var ue *UnresolvedError
	if !errors.Is(err, ErrUnresolvable) || !errors.As(err, &ue) || !reflect.DeepEqual(ue.Devices, []string{"nvidia.com/gpu=7"}) {
		t.Fatalf("Inject of an unknown device: %v", err)
	}
	if !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), gpus.Dir) {
		t.Errorf("error %q does not name the dir and the broken spec", err)
	}
	if !reflect.DeepEqual(s, baseSpec()) {
		t.Errorf("a refused injection changed the spec: %+v", s)
	}

	for _, name := range []string{"gpu0", "nvidia.com/gpu", "=0", "nvidia.com/gpu=", "nvidia.com/gpu=a b"} {
		if err := r.Inject(baseSpec(), []string{name}); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Inject(%q) = %v, want ErrInvalidName", name, err)
		}
	}

	// The spec names the device but its node is gone from the host.
	if err := os.Remove(gpus.HostNodes[1]); err != nil {
		t.Fatal(err)
	}
	s = baseSpec()
	if err := r.Inject(s, []string{gpus.ByIndex(1)}); !errors.Is(err, ErrInject) {
		t.Fatalf("Inject with a missing host node = %v, want ErrInject", err)
	}
	if !reflect.DeepEqual(s, baseSpec()) {
		t.Errorf("a failed injection changed the spec: %+v", s)
	}
	if err := r.Inject(baseSpec(), nil); err != nil {
		t.Errorf("Inject of nothing: %v", err)
	}
}

func TestScan_WarnsOnceForTheSameBrokenSpec(t *testing.T) {
	dir := t.TempDir()
	testenv.WriteMalformedCDISpec(t, dir)
	core, logs := observer.New(zap.DebugLevel)
	r := New([]string{dir}, zap.New(core))
	for range 3 {
		r.Scan()
	}
	if n := logs.FilterLevelExact(zap.WarnLevel).Len(); n != 1 {
		t.Fatalf("%d warnings for one broken spec scanned three times, want 1", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "other.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.Scan()
	if n := logs.FilterLevelExact(zap.WarnLevel).Len(); n != 3 {
		t.Fatalf("%d warnings after a second broken spec appeared, want 3 (both, once more)", n)
	}
}
