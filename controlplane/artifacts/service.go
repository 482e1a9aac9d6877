package artifacts

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// Service answers operators' catalog changes on wf.admin.artifact.register
// and wf.admin.artifact.rm, in the control plane's queue group. Replies
// are schemas.Reply[schemas.ArtifactRecord] in the request's encoding.
type Service struct {
	cat *Catalog
	nc  *nats.Conn
	log *zap.Logger
}

// NewService returns the service over cat.
func NewService(cat *Catalog, nc *nats.Conn, log *zap.Logger) *Service {
	return &Service{cat: cat, nc: nc, log: log}
}

// Serve subscribes until stop is called; each request's work ends with ctx.
func (s *Service) Serve(ctx context.Context) (stop func(), err error) {
	subs, err := bus.QueueSubscribeAll(s.nc, map[string]nats.MsgHandler{
		bus.SubjectArtifactRegister: func(m *nats.Msg) { s.handleRegister(ctx, m) },
		bus.SubjectArtifactRemove:   func(m *nats.Msg) { s.handleRemove(ctx, m) },
	})
	if err != nil {
		return nil, err
	}
	return subs.Stop, nil
}

// DecodeRegistration decodes and checks a registration body (JSON or
// msgpack, by header or first byte). Any error is a refusal that does not
// echo the input.
func DecodeRegistration(h nats.Header, data []byte) (schemas.ArtifactRegistration, codec.Encoding, error) {
	var reg schemas.ArtifactRegistration
	enc := codec.Detect(h, data)
	if err := codec.Decode(enc, data, &reg); err != nil {
		return reg, enc, schemas.RefusalOfInput(err, "body is not an ArtifactRegistration")
	}
	if err := checkVersion(reg.Version); err != nil {
		return reg, enc, err
	}
	if err := reg.Record.Validate(); err != nil {
		return reg, enc, err
	}
	return reg, enc, nil
}

// decodeRemoval decodes and checks a removal body.
func decodeRemoval(h nats.Header, data []byte) (schemas.ArtifactRemoval, codec.Encoding, error) {
	var rm schemas.ArtifactRemoval
	enc := codec.Detect(h, data)
	if err := codec.Decode(enc, data, &rm); err != nil {
		return rm, enc, schemas.RefusalOfInput(err, "body is not an ArtifactRemoval")
	}
	if err := checkVersion(rm.Version); err != nil {
		return rm, enc, err
	}
	if err := schemas.ValidateArtifactName("name", rm.Name); err != nil {
		return rm, enc, err
	}
	if err := schemas.ValidateArtifactVersion("artifact_version", rm.ArtifactVersion); err != nil {
		return rm, enc, err
	}
	return rm, enc, nil
}

func checkVersion(v int) error {
	if v < 0 || v > schemas.SchemaVersion {
		return refuse(schemas.CodeUnsupportedVersion, "version", "version %d is not supported; this control plane speaks %d", v, schemas.SchemaVersion)
	}
	return nil
}

func (s *Service) handleRegister(ctx context.Context, m *nats.Msg) {
	reg, enc, err := DecodeRegistration(m.Header, m.Data)
	if err != nil {
		s.reply(m, enc, schemas.Reply[schemas.ArtifactRecord]{Refusal: schemas.AsRefusal(err)})
		return
	}
	rec, err := s.cat.Register(ctx, reg.Record)
	s.answer(m, enc, rec, err)
}

func (s *Service) handleRemove(ctx context.Context, m *nats.Msg) {
	rm, enc, err := decodeRemoval(m.Header, m.Data)
	if err != nil {
		s.reply(m, enc, schemas.Reply[schemas.ArtifactRecord]{Refusal: schemas.AsRefusal(err)})
		return
	}
	rec, err := s.cat.Remove(ctx, rm.Name, rm.ArtifactVersion)
	s.answer(m, enc, rec, err)
}

func (s *Service) answer(m *nats.Msg, enc codec.Encoding, rec schemas.ArtifactRecord, err error) {
	if err != nil {
		ref := schemas.AsRefusal(err)
		if ref.Code == schemas.CodeInternal {
			s.log.Warn("artifact request failed", zap.String("subject", m.Subject), zap.Error(err))
		}
		s.reply(m, enc, schemas.Reply[schemas.ArtifactRecord]{Refusal: ref})
		return
	}
	s.reply(m, enc, schemas.Reply[schemas.ArtifactRecord]{OK: &rec})
}

func (s *Service) reply(m *nats.Msg, enc codec.Encoding, v any) {
	if err := bus.Respond(m, enc, v); err != nil {
		s.log.Error("reply", zap.String("subject", m.Subject), zap.Error(err))
	}
}
