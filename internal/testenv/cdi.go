package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// CDIKind is the device kind the fake GPU specs declare, as nvidia-ctk's do.
const CDIKind = "nvidia.com/gpu"

// CDIGPUs is a CDI spec directory declaring two fake GPUs, the way
// nvidia-ctk cdi generate declares real ones: devices "nvidia.com/gpu=0"
// and "nvidia.com/gpu=GPU-<uuid>" for each card, each with a device node
// (a character device with /dev/null's numbers, 1:3, made by the test)
// mapped to /dev/nvidia<i> in the container and NVIDIA_VISIBLE_DEVICES set
// to its index, plus "nvidia.com/gpu=all".
type CDIGPUs struct {
	// Dir is the spec directory; the spec is Dir/nvidia.yaml.
	Dir string
	// UUIDs are the two cards' UUIDs, by index.
	UUIDs [2]string
	// HostNodes are the device nodes backing the cards, by index.
	HostNodes [2]string
}

// ByIndex is card i's CDI name by index, e.g. "nvidia.com/gpu=0".
func (c CDIGPUs) ByIndex(i int) string { return fmt.Sprintf("%s=%d", CDIKind, i) }

// ByUUID is card i's CDI name by UUID.
func (c CDIGPUs) ByUUID(i int) string { return CDIKind + "=" + c.UUIDs[i] }

// WriteCDIGPUs writes the spec into a new temp directory. It needs root
// (mknod) and skips t otherwise, failing under CI.
func WriteCDIGPUs(t testing.TB) CDIGPUs {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	nodes := t.TempDir()
	c := CDIGPUs{Dir: dir, UUIDs: [2]string{"GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"}}
	type node struct {
		Path     string `json:"path"`
		HostPath string `json:"hostPath"`
	}
	type edits struct {
		Env         []string `json:"env,omitempty"`
		DeviceNodes []node   `json:"deviceNodes,omitempty"`
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	spec := struct {
		Version        string   `json:"cdiVersion"`
		Kind           string   `json:"kind"`
		Devices        []device `json:"devices"`
		ContainerEdits edits    `json:"containerEdits"`
	}{Version: "0.5.0", Kind: CDIKind, ContainerEdits: edits{Env: []string{"WARMFLEET_CDI_SPEC=fake-gpus"}}}
	all := edits{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}
	for i := range 2 {
		c.HostNodes[i] = filepath.Join(nodes, fmt.Sprintf("nvidia%d", i))
		if err := unix.Mknod(c.HostNodes[i], unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("testenv: mknod %s: %v", c.HostNodes[i], err)
		}
		n := node{Path: fmt.Sprintf("/dev/nvidia%d", i), HostPath: c.HostNodes[i]}
		e := edits{Env: []string{fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%d", i)}, DeviceNodes: []node{n}}
		spec.Devices = append(spec.Devices, device{Name: fmt.Sprint(i), ContainerEdits: e}, device{Name: c.UUIDs[i], ContainerEdits: e})
		all.DeviceNodes = append(all.DeviceNodes, n)
	}
	spec.Devices = append(spec.Devices, device{Name: "all", ContainerEdits: all})
	// JSON is YAML too; nvidia-ctk writes the same fields in YAML.
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatalf("testenv: CDI spec: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), data, 0o644); err != nil {
		t.Fatalf("testenv: write CDI spec: %v", err)
	}
	return c
}

// WriteMalformedCDISpec writes a spec file into dir that does not parse,
// and returns its path.
func WriteMalformedCDISpec(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(p, []byte("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [ {name: \"0\", containerEdits: {env: \n"), 0o644); err != nil {
		t.Fatalf("testenv: write CDI spec: %v", err)
	}
	return p
}
