package runpod

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// wirePod is the part of RunPod's Pod object (REST v1, /pods) this adapter
// reads. costPerHr is documented as a string ("0.74"); a number is taken
// too.
type wirePod struct {
	ID                string            `json:"id"`
	Name              string            `json:"name"`
	DesiredStatus     string            `json:"desiredStatus"`
	CostPerHr         flexFloat         `json:"costPerHr"`
	AdjustedCostPerHr flexFloat         `json:"adjustedCostPerHr"`
	Interruptible     bool              `json:"interruptible"`
	LastStartedAt     string            `json:"lastStartedAt"`
	LastStatusChange  string            `json:"lastStatusChange"`
	Env               map[string]string `json:"env"`
	Image             string            `json:"image"`
	MachineID         string            `json:"machineId"`
	GPU               *struct {
		ID    string `json:"id"`
		Count int    `json:"count"`
	} `json:"gpu"`
}

// flexFloat reads a JSON number or a string holding one.
type flexFloat float64

func (f *flexFloat) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "" || s == "null" {
		*f = 0
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("not a price: %q", s)
	}
	*f = flexFloat(v)
	return nil
}

// wireCreatePod is the body of POST /pods.
type wireCreatePod struct {
	Name              string            `json:"name"`
	ImageName         string            `json:"imageName"`
	GPUTypeIDs        []string          `json:"gpuTypeIds"`
	GPUCount          int               `json:"gpuCount"`
	Interruptible     bool              `json:"interruptible"`
	CloudType         string            `json:"cloudType,omitempty"`
	ContainerDiskInGb int               `json:"containerDiskInGb"`
	VolumeInGb        int               `json:"volumeInGb"`
	VolumeMountPath   string            `json:"volumeMountPath"`
	Env               map[string]string `json:"env"`
}

// wireGPUType is one entry of the GraphQL gpuTypes query.
type wireGPUType struct {
	ID                 string  `json:"id"`
	DisplayName        string  `json:"displayName"`
	MemoryInGb         float64 `json:"memoryInGb"`
	SecureCloud        bool    `json:"secureCloud"`
	CommunityCloud     bool    `json:"communityCloud"`
	SecurePrice        float64 `json:"securePrice"`
	CommunityPrice     float64 `json:"communityPrice"`
	SecureSpotPrice    float64 `json:"secureSpotPrice"`
	CommunitySpotPrice float64 `json:"communitySpotPrice"`
}

// gpuTypesQuery asks for the catalogue with its prices.
const gpuTypesQuery = `query GpuTypes { gpuTypes { id displayName memoryInGb secureCloud communityCloud securePrice communityPrice secureSpotPrice communitySpotPrice } }`

// decodePod reads one Pod.
func decodePod(b []byte) (wirePod, error) {
	var p wirePod
	if err := json.Unmarshal(b, &p); err != nil {
		return wirePod{}, err
	}
	if p.ID == "" {
		return wirePod{}, fmt.Errorf("pod without an id")
	}
	return p, nil
}

// decodePods reads a list of Pods, dropping any without an id.
func decodePods(b []byte) ([]wirePod, error) {
	var ps []wirePod
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, err
	}
	out := ps[:0]
	for _, p := range ps {
		if p.ID != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// decodeGPUTypes reads the gpuTypes answer: its data, or its first error.
func decodeGPUTypes(b []byte) ([]wireGPUType, error) {
	var resp struct {
		Data struct {
			GPUTypes []wireGPUType `json:"gpuTypes"`
		} `json:"data"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, err
	}
	if len(resp.Errors) > 0 {
		return nil, fmt.Errorf("gpuTypes: %s", resp.Errors[0].Message)
	}
	return resp.Data.GPUTypes, nil
}
