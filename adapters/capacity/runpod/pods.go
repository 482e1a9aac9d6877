package runpod

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// The marks every pod of ours carries in its environment.
const (
	envBootstrap  = "WARMFLEET_BOOTSTRAP"
	envOwner      = "WARMFLEET_OWNER"
	envConnection = "WARMFLEET_CONNECTION"
	envRental     = "WARMFLEET_RENTAL"
	envGeneration = "WARMFLEET_GENERATION"
	envOperation  = "WARMFLEET_OPERATION_KEY"
)

// ProvisionCapacity creates a pod for the rental, unless one carrying our
// ownership token and this OperationKey exists, which is answered as a
// Duplicate: RunPod takes no idempotency key, so this listing is what makes
// a retried provision safe.
func (p *Provider) ProvisionCapacity(ctx context.Context, cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	const op = "provision"
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, err
	}
	gpuType, count, spot, err := p.gpuTypeOf(ctx, cmd.OfferID)
	if err != nil {
		var ce *capacity.Error
		if errors.As(err, &ce) {
			return capacity.Receipt{}, err
		}
		return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: op, Ref: cmd.RentalID, Message: err.Error()}
	}
	unlock, err := p.keys.LockContext(ctx, cmd.OperationKey)
	if err != nil {
		return capacity.Receipt{}, fmt.Errorf("runpod %s %s: %w", op, cmd.RentalID, err)
	}
	defer unlock()
	pods, err := p.listPods(ctx, op, cmd.RentalID)
	if err != nil {
		return capacity.Receipt{}, err
	}
	for _, pod := range pods {
		if ownedBy(pod, cmd.OwnershipToken) && pod.Env[envOperation] == cmd.OperationKey {
			return p.receipt(pod, true), nil
		}
	}
	boot, err := json.Marshal(cmd.Bootstrap)
	if err != nil {
		return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: op, Ref: cmd.RentalID, Message: "bootstrap does not encode"}
	}
	req := wireCreatePod{
		Name: podName(cmd.RentalID, cmd.Generation), ImageName: p.cfg.Image, GPUTypeIDs: []string{gpuType}, GPUCount: count,
		Interruptible: spot, CloudType: strings.ToUpper(p.cfg.CloudType), ContainerDiskInGb: p.cfg.ContainerDiskGB, VolumeInGb: p.cfg.VolumeGB,
		VolumeMountPath: "/workspace",
		Env: map[string]string{
			envBootstrap: base64.StdEncoding.EncodeToString(boot), envOwner: cmd.OwnershipToken, envConnection: cmd.ConnectionID,
			envRental: cmd.RentalID, envGeneration: strconv.FormatUint(cmd.Generation, 10), envOperation: cmd.OperationKey,
		},
	}
	body, err := p.rest.Call(ctx, op, cmd.RentalID, http.MethodPost, "/pods", req)
	if err != nil {
		return capacity.Receipt{}, err
	}
	pod, err := decodePod(body)
	if err != nil {
		return capacity.Receipt{}, p.rest.DecodeError(op, cmd.RentalID, err)
	}
	p.log.Info("runpod pod created", zap.String("pod", pod.ID), zap.String("rental", cmd.RentalID), zap.String("gpu_type", gpuType),
		zap.Bool("interruptible", pod.Interruptible))
	return p.receipt(pod, false), nil
}

// receipt answers a provision with the pod.
func (p *Provider) receipt(pod wirePod, dup bool) capacity.Receipt {
	rc := capacity.Receipt{NativeRef: pod.ID, State: p.stateOf(pod), AcceptedAt: p.now(), Duplicate: dup, Interruptible: pod.Interruptible}
	if m, ok := micros(float64(pod.CostPerHr)); ok {
		rc.Pricing = capacity.Price{Currency: "USD", MicrosPerHour: m, Exact: true}
	}
	if rc.State == capacity.StateRunning || rc.State == capacity.StateUnknown {
		rc.State = capacity.StateProvisioning
	}
	return rc
}

// ObserveCapacity reads one pod of ours.
func (p *Provider) ObserveCapacity(ctx context.Context, ref capacity.Ref) (capacity.Observation, error) {
	if err := ref.Validate(); err != nil {
		return capacity.Observation{}, err
	}
	pod, err := p.ownedPod(ctx, "observe", ref)
	if err != nil {
		return capacity.Observation{}, err
	}
	obs := capacity.Observation{NativeRef: pod.ID, State: p.stateOf(pod), ObservedAt: p.now(), Interrupted: p.interrupted(pod), NativeJSON: nativeJSON(pod)}
	if obs.State == capacity.StateRunning {
		obs.StateSince = parseTime(pod.LastStartedAt)
	}
	return obs, nil
}

// StopCapacity stops a pod, keeping its volume.
func (p *Provider) StopCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	return p.act(ctx, "stop", cmd, "/stop", capacity.StateStopping)
}

// StartCapacity starts a stopped pod again.
func (p *Provider) StartCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	return p.act(ctx, "start", cmd, "/start", capacity.StateBooting)
}

// act posts a power action to one pod of ours.
func (p *Provider) act(ctx context.Context, op string, cmd capacity.Command, action string, to capacity.State) (capacity.Receipt, error) {
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, err
	}
	pod, err := p.ownedPod(ctx, op, cmd.Ref)
	if err != nil {
		return capacity.Receipt{}, err
	}
	if s := p.stateOf(pod); (op == "stop" && s == capacity.StateStopped) || (op == "start" && s == capacity.StateRunning) {
		return capacity.Receipt{NativeRef: pod.ID, State: s, AcceptedAt: p.now(), Duplicate: true, Interruptible: pod.Interruptible}, nil
	}
	p.mu.Lock()
	p.stopped[pod.ID] = op == "stop"
	p.mu.Unlock()
	if _, err := p.rest.Call(ctx, op, pod.ID, http.MethodPost, "/pods/"+url.PathEscape(pod.ID)+action, nil); err != nil {
		return capacity.Receipt{}, err
	}
	return capacity.Receipt{NativeRef: pod.ID, State: to, AcceptedAt: p.now(), Interruptible: pod.Interruptible}, nil
}

// TerminateCapacity deletes a pod of ours; one already gone succeeds.
func (p *Provider) TerminateCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	const op = "terminate"
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, err
	}
	gone := capacity.Receipt{NativeRef: cmd.NativeRef, State: capacity.StateTerminated, AcceptedAt: p.now(), Duplicate: true}
	pod, err := p.ownedPod(ctx, op, cmd.Ref)
	var notOurs *notOursError
	switch {
	case errors.As(err, &notOurs):
		return capacity.Receipt{}, err // someone else's: never touched
	case errors.Is(err, capacity.ErrNotFound):
		return gone, nil
	case err != nil:
		return capacity.Receipt{}, err
	}
	if _, err := p.rest.Call(ctx, op, pod.ID, http.MethodDelete, "/pods/"+url.PathEscape(pod.ID), nil); err != nil {
		if errors.Is(err, capacity.ErrNotFound) {
			return gone, nil
		}
		return capacity.Receipt{}, err
	}
	p.mu.Lock()
	delete(p.stopped, pod.ID)
	p.mu.Unlock()
	return capacity.Receipt{NativeRef: pod.ID, State: capacity.StateTerminated, AcceptedAt: p.now()}, nil
}

// ListOwnedCapacity lists the pods carrying the query's ownership token.
func (p *Provider) ListOwnedCapacity(ctx context.Context, q capacity.OwnershipQuery) ([]capacity.OwnedCapacity, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	pods, err := p.listPods(ctx, "list_owned", q.RentalID)
	if err != nil {
		return nil, err
	}
	var out []capacity.OwnedCapacity
	for _, pod := range pods {
		if !ownedBy(pod, q.OwnershipToken) || (q.RentalID != "" && pod.Env[envRental] != q.RentalID) {
			continue
		}
		gen, _ := strconv.ParseUint(pod.Env[envGeneration], 10, 64)
		out = append(out, capacity.OwnedCapacity{NativeRef: pod.ID, ConnectionID: pod.Env[envConnection], RentalID: pod.Env[envRental], Generation: gen,
			OwnershipToken: pod.Env[envOwner], OperationKey: pod.Env[envOperation], State: p.stateOf(pod)})
	}
	return out, nil
}

// listPods reads every pod of the account.
func (p *Provider) listPods(ctx context.Context, op, ref string) ([]wirePod, error) {
	body, err := p.rest.Call(ctx, op, ref, http.MethodGet, "/pods", nil)
	if err != nil {
		return nil, err
	}
	pods, err := decodePods(body)
	if err != nil {
		return nil, p.rest.DecodeError(op, ref, err)
	}
	return pods, nil
}

// ownedPod reads one pod; a pod that is not ours is not found.
func (p *Provider) ownedPod(ctx context.Context, op string, ref capacity.Ref) (wirePod, error) {
	body, err := p.rest.Call(ctx, op, ref.NativeRef, http.MethodGet, "/pods/"+url.PathEscape(ref.NativeRef), nil)
	if err != nil {
		return wirePod{}, err
	}
	pod, err := decodePod(body)
	if err != nil {
		return wirePod{}, p.rest.DecodeError(op, ref.NativeRef, err)
	}
	if pod.ID != ref.NativeRef || !ownedBy(pod, ref.OwnershipToken) {
		return wirePod{}, &notOursError{err: &capacity.Error{Code: capacity.CodeNotFound, Provider: Type, Op: op, Ref: ref.NativeRef, Message: "no pod of ours by that id"}}
	}
	if p.stateOf(pod) == capacity.StateTerminated {
		return wirePod{}, &capacity.Error{Code: capacity.CodeNotFound, Provider: Type, Op: op, Ref: ref.NativeRef, Message: "pod terminated"}
	}
	return pod, nil
}

// notOursError is a pod that exists but carries another ownership token:
// not found to us, and never acted on.
type notOursError struct{ err *capacity.Error }

func (e *notOursError) Error() string { return e.err.Error() }
func (e *notOursError) Unwrap() error { return e.err }

func ownedBy(pod wirePod, token string) bool { return token != "" && pod.Env[envOwner] == token }

// stateOf maps a pod's desired status: RUNNING is running once it has
// started, EXITED stopped, TERMINATED terminated.
func (p *Provider) stateOf(pod wirePod) capacity.State {
	switch pod.DesiredStatus {
	case "RUNNING":
		if pod.LastStartedAt != "" {
			return capacity.StateRunning
		}
		return capacity.StateProvisioning
	case "EXITED":
		return capacity.StateStopped
	case "TERMINATED":
		return capacity.StateTerminated
	}
	return capacity.StateUnknown
}

// interrupted reports an interruptible pod stopped by RunPod rather than
// by us: one this process did not ask to stop, or whose status change says
// it was outbid or preempted.
func (p *Provider) interrupted(pod wirePod) bool {
	if !pod.Interruptible || p.stateOf(pod) != capacity.StateStopped {
		return false
	}
	change := strings.ToLower(pod.LastStatusChange)
	for _, w := range []string{"outbid", "interrupt", "preempt", "reclaim"} {
		if strings.Contains(change, w) {
			return true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	asked, known := p.stopped[pod.ID]
	return !known || !asked
}

// nativeJSON is the pod's record without its environment (the bootstrap
// and our marks).
func nativeJSON(pod wirePod) string {
	pod.Env = nil
	b, _ := json.Marshal(pod)
	return string(b)
}

func podName(rental string, gen uint64) string { return fmt.Sprintf("wf-%s-g%d", rental, gen) }

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
