package shadeform

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
)

// Wire shapes of Shadeform's API (https://docs.shadeform.ai/api-reference).
// Only the fields the adapter uses are decoded, and the non-essential ones
// leniently (num, stamp), so a field that changes type upstream degrades
// one fact instead of failing the whole call.

type wireInstanceTypes struct {
	InstanceTypes []wireInstanceType `json:"instance_types"`
}

type wireInstanceType struct {
	Cloud             string             `json:"cloud"`
	Region            string             `json:"region"`
	ShadeInstanceType string             `json:"shade_instance_type"`
	Configuration     wireConfiguration  `json:"configuration"`
	HourlyPrice       num                `json:"hourly_price"` // cents
	Availability      []wireAvailability `json:"availability"`
	// BootTime is Shadeform's estimate of how long an instance of this
	// type takes to become active; absent on some entries.
	BootTime *wireBootTime `json:"boot_time"`
}

type wireBootTime struct {
	MinBootInSec num `json:"min_boot_in_sec"`
	MaxBootInSec num `json:"max_boot_in_sec"`
}

type wireAvailability struct {
	Region    string `json:"region"`
	Available bool   `json:"available"`
	// RentalType ("on_demand", "spot") appears on newer responses; an
	// absent one means on-demand.
	RentalType string `json:"rental_type"`
}

type wireConfiguration struct {
	GPUType        string `json:"gpu_type"`
	NumGPUs        num    `json:"num_gpus"`
	VRAMPerGPUInGB num    `json:"vram_per_gpu_in_gb"`
	MemoryInGB     num    `json:"memory_in_gb"`
	StorageInGB    num    `json:"storage_in_gb"`
	VCPUs          num    `json:"vcpus"`
}

type wireInstances struct {
	Instances []wireInstance `json:"instances"`
}

type wireInstance struct {
	ID                string   `json:"id"`
	Cloud             string   `json:"cloud"`
	Region            string   `json:"region"`
	ShadeInstanceType string   `json:"shade_instance_type"`
	Name              string   `json:"name"`
	IP                string   `json:"ip"`
	Status            string   `json:"status"`
	HourlyPrice       num      `json:"hourly_price"`
	Tags              []string `json:"tags"`
	CreatedAt         stamp    `json:"created_at"`
	ActiveAt          stamp    `json:"active_at"`
	DeletedAt         stamp    `json:"deleted_at"`
}

type wireCreateResponse struct {
	ID              string `json:"id"`
	CloudAssignedID string `json:"cloud_assigned_id"`
}

// Request bodies.

type wireCreateRequest struct {
	Cloud               string                  `json:"cloud"`
	Region              string                  `json:"region"`
	ShadeInstanceType   string                  `json:"shade_instance_type"`
	ShadeCloud          bool                    `json:"shade_cloud"`
	Name                string                  `json:"name"`
	OS                  string                  `json:"os,omitempty"`
	SSHKeyID            string                  `json:"ssh_key_id,omitempty"`
	LaunchConfiguration wireLaunchConfiguration `json:"launch_configuration"`
	AutoDelete          *wireAutoDelete         `json:"auto_delete,omitempty"`
	Tags                []string                `json:"tags"`
}

type wireLaunchConfiguration struct {
	Type                string                  `json:"type"`
	ScriptConfiguration wireScriptConfiguration `json:"script_configuration"`
}

type wireScriptConfiguration struct {
	Base64Script string `json:"base64_script"`
}

type wireAutoDelete struct {
	DateThreshold string `json:"date_threshold"`
}

// errNoID is a 2xx answer that names no instance.
var errNoID = errors.New("response names no instance id")

func decodeInstanceTypes(body []byte) ([]wireInstanceType, error) {
	var w wireInstanceTypes
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, err
	}
	return w.InstanceTypes, nil
}

func decodeInstances(body []byte) ([]wireInstance, error) {
	var w wireInstances
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, err
	}
	return w.Instances, nil
}

func decodeInstance(body []byte) (wireInstance, error) {
	var w wireInstance
	if err := json.Unmarshal(body, &w); err != nil {
		return w, err
	}
	if w.ID == "" {
		return w, errNoID
	}
	return w, nil
}

func decodeCreate(body []byte) (wireCreateResponse, error) {
	var w wireCreateResponse
	if err := json.Unmarshal(body, &w); err != nil {
		return w, err
	}
	if w.ID == "" {
		return w, errNoID
	}
	return w, nil
}

// num is a JSON number that also accepts null, a numeric string, and
// non-finite garbage (as zero).
type num float64

func (n *num) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		b = []byte(strings.TrimSpace(s))
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		*n = 0
		return nil
	}
	*n = num(f)
	return nil
}

// count is n as a non-negative integer no larger than limit.
func (n num) count(limit int64) int64 {
	f := float64(n)
	switch {
	case f <= 0:
		return 0
	case f >= float64(limit):
		return limit
	}
	return int64(f)
}

// Limits that keep conversions from overflowing whatever a response says.
const (
	maxCount = 1 << 20 // GPUs, vCPUs, GiB
	maxCents = 1 << 40
)

// stamp is a timestamp that decodes to the zero time when absent, null or
// unparseable: a missing date is "the provider did not say", never an
// error.
type stamp struct{ time.Time }

var stampLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05"}

func (s *stamp) UnmarshalJSON(b []byte) error {
	s.Time = time.Time{}
	var str string
	if err := json.Unmarshal(b, &str); err != nil || str == "" {
		return nil
	}
	for _, layout := range stampLayouts {
		if t, err := time.Parse(layout, str); err == nil {
			s.Time = t.UTC()
			return nil
		}
	}
	return nil
}
