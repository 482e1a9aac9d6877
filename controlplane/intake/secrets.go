package intake

import (
	"context"
	"errors"
	"strconv"

	"github.com/warmfleet/warmfleet/schemas"
)

// SecretChecker is what intake asks of the secret store: whether tenant
// holds a secret of that name. A missing secret is (false, nil); a
// *schemas.Refusal refuses the Run; any other error is transient (the
// submit is redelivered).
type SecretChecker interface {
	Exists(ctx context.Context, tenant, name string) (bool, error)
}

// checkSecrets refuses a Run that references a secret its tenant lacks,
// with schemas.CodeSecretUnknown naming the reference's field. Another
// tenant's secret is unknown too: names are per tenant. Only names are
// looked at; no value is read here.
func (in *Intake) checkSecrets(ctx context.Context, tenant string, req schemas.RunRequest) error {
	if len(req.SecretEnv) == 0 && len(req.SecretFiles) == 0 {
		return nil
	}
	type ref struct{ field, name string }
	refs := make([]ref, 0, len(req.SecretEnv)+len(req.SecretFiles))
	for i, e := range req.SecretEnv {
		refs = append(refs, ref{"secret_env[" + strconv.Itoa(i) + "].secret", e.Secret})
	}
	for i, f := range req.SecretFiles {
		refs = append(refs, ref{"secret_files[" + strconv.Itoa(i) + "].secret", f.Secret})
	}
	if in.secrets == nil {
		return &schemas.Refusal{Code: schemas.CodeSecretUnknown, Field: refs[0].field,
			Reason: "this control plane holds no secrets; submit the Run without secret_env and secret_files"}
	}
	known := make(map[string]bool, len(refs))
	for _, r := range refs {
		if known[r.name] {
			continue
		}
		ok, err := in.secrets.Exists(ctx, tenant, r.name)
		var refused *schemas.Refusal
		if errors.As(err, &refused) {
			// The store refuses the question itself (a tenant it does not
			// serve): a refusal of the Run, naming the reference.
			return &schemas.Refusal{Code: refused.Code, Field: r.field, Reason: refused.Reason}
		}
		if err != nil {
			return err
		}
		if !ok {
			return &schemas.Refusal{Code: schemas.CodeSecretUnknown, Field: r.field,
				Reason: "tenant " + tenant + " holds no secret " + r.name + "; set it with `warmfleet secret set --tenant " + tenant + " " + r.name + "` and submit again"}
		}
		known[r.name] = true
	}
	return nil
}
