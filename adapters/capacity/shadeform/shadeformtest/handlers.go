package shadeformtest

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

func (s *Server) handleTypes(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	onlyAvailable := r.URL.Query().Get("available") == "true"
	out := []InstanceType{}
	for _, t := range s.types {
		if onlyAvailable && !anyAvailable(t) {
			continue
		}
		out = append(out, t)
	}
	writeJSON(w, http.StatusOK, map[string]any{"instance_types": out})
}

func anyAvailable(t InstanceType) bool {
	for _, a := range t.Availability {
		if a.Available {
			return true
		}
	}
	return false
}

// handleList answers "active and pending instances" (deleting ones too:
// they still exist).
func (s *Server) handleList(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, id := range s.order {
		in := s.instances[id]
		in.settle(s.now)
		if in.Status != "deleted" {
			out = append(out, in.wire())
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"instances": out})
}

type createRequest struct {
	Cloud               string `json:"cloud"`
	Region              string `json:"region"`
	ShadeInstanceType   string `json:"shade_instance_type"`
	ShadeCloud          *bool  `json:"shade_cloud"`
	Name                string `json:"name"`
	LaunchConfiguration *struct {
		Type                string `json:"type"`
		ScriptConfiguration *struct {
			Base64Script string `json:"base64_script"`
		} `json:"script_configuration"`
	} `json:"launch_configuration"`
	AutoDelete *struct {
		DateThreshold string `json:"date_threshold"`
	} `json:"auto_delete"`
	Tags []string `json:"tags"`
}

func badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		badRequest(w, "unreadable body")
		return
	}
	var req createRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		badRequest(w, "body is not JSON: "+err.Error())
		return
	}
	if req.Cloud == "" || req.Region == "" || req.ShadeInstanceType == "" || req.ShadeCloud == nil || req.Name == "" {
		badRequest(w, "cloud, region, shade_instance_type, shade_cloud and name are required")
		return
	}
	var script []byte
	if lc := req.LaunchConfiguration; lc != nil {
		if lc.Type != "script" || lc.ScriptConfiguration == nil {
			badRequest(w, "launch_configuration type script needs script_configuration")
			return
		}
		if script, err = base64.StdEncoding.DecodeString(lc.ScriptConfiguration.Base64Script); err != nil {
			badRequest(w, "base64_script is not base64")
			return
		}
	}
	var autoDelete time.Time
	if req.AutoDelete != nil {
		if autoDelete, err = time.Parse(time.RFC3339, req.AutoDelete.DateThreshold); err != nil {
			badRequest(w, "auto_delete.date_threshold is not RFC 3339")
			return
		}
	}

	s.mu.Lock()
	t, ok := s.findType(req.Cloud, req.ShadeInstanceType)
	if !ok {
		s.mu.Unlock()
		badRequest(w, "unknown instance type "+req.ShadeInstanceType+" in "+req.Cloud)
		return
	}
	if !availableIn(t, req.Region) {
		s.mu.Unlock()
		writeJSON(w, http.StatusConflict, map[string]string{"error": "Instance type " + req.ShadeInstanceType + " is out of stock in " + req.Region})
		return
	}
	in := s.newInstance(req.Cloud, req.Region, t, req.Name, req.Tags)
	in.Script, in.Request, in.AutoDeleteAt = script, raw, autoDelete
	lose := s.loseNext > 0
	if lose {
		s.loseNext--
	}
	id, cloudID := in.ID, in.CloudAssignedID
	s.mu.Unlock()

	if lose {
		// The instance exists; the answer never arrives.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "cloud_assigned_id": cloudID})
}

func (s *Server) findType(cloud, shadeType string) (InstanceType, bool) {
	for _, t := range s.types {
		if t.Cloud == cloud && t.ShadeInstanceType == shadeType {
			return t, true
		}
	}
	return InstanceType{}, false
}

func availableIn(t InstanceType, region string) bool {
	for _, a := range t.Availability {
		if a.Region == region && a.Available && (a.RentalType == "" || a.RentalType == "on_demand") {
			return true
		}
	}
	return false
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[r.PathValue("id")]
	if in == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "Instance not found"})
		return
	}
	in.settle(s.now)
	writeJSON(w, http.StatusOK, in.wire())
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[r.PathValue("id")]
	if in == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "Instance not found"})
		return
	}
	in.settle(s.now)
	if in.Status == "pending" || in.Status == "active" {
		in.Status, in.deleteDue = "deleting", s.now.Add(s.deleteIn)
		in.settle(s.now)
	}
	w.WriteHeader(http.StatusOK)
}
