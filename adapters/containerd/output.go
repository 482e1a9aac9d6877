package containerd

import (
	"os"
	"path/filepath"

	"github.com/containerd/containerd/cio"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// outputs is where workloads' output goes: containerd's shim runs the log
// writer beside each workload, so output keeps reaching disk while the
// agent is down and never passes through the agent's own stdio. A workload
// whose spec names no directory gets one of the runtime's own, which
// Remove deletes.
type outputs struct {
	dir    string // holds <dir>/<id> of workloads that name none
	writer string // the log writer binary (Options.LogWriter)
	log    *zap.Logger
}

// dirOf is the output directory of a workload whose spec names none.
func (o outputs) dirOf(id string) string { return filepath.Join(o.dir, id) }

// clear readies spec's output: a reused id must not inherit an earlier
// workload's output in a directory of the runtime's own.
func (o outputs) clear(spec noderuntime.WorkloadSpec) error {
	if spec.Output.Dir != "" {
		return nil
	}
	return os.RemoveAll(o.dirOf(spec.ID))
}

// io runs spec's log writer as the task's stdio.
func (o outputs) io(spec noderuntime.WorkloadSpec) cio.Creator {
	dir := spec.Output.Dir
	if dir == "" {
		dir = o.dirOf(spec.ID)
	}
	ws := nodelog.WriterSpec{Dir: dir, Limit: nodelog.Limit{BytesPerSecond: spec.Output.BytesPerSecond, Burst: spec.Output.Burst}}
	return cio.BinaryIO(o.writer, map[string]string{nodelog.WriterFlag: ws.Encode()})
}

// remove deletes a removed workload's own output directory; a failure is
// logged, the workload is gone all the same.
func (o outputs) remove(id string) {
	if err := os.RemoveAll(o.dirOf(id)); err != nil {
		o.log.Warn("remove output", zap.String("workload", id), zap.Error(err))
	}
}
