package test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// helmModule is the Helm the chart is tested with; CI installs exactly this.
const helmModule = "helm.sh/helm/v4/cmd/helm@v4.3.2"

// chartDir is the chart, relative to the module root.
const chartDir = "packaging/helm/fluksio-worker"

// TestHelmChart lints and renders the chart with each values file in its
// ci/ directory (the minimum a user sets; every optional part on; a Job; a
// KEDA ScaledJob), decodes every manifest strictly into the Kubernetes API
// types (an unknown or misplaced field fails), and checks what matters: the
// token is only ever a file from a Secret, the init container puts the
// binary where the main container runs it, the probe asks the port the
// worker listens on, and the pod may take as long to stop as the worker's
// stop ladder needs.
func TestHelmChart(t *testing.T) {
	helm := installHelm(t)
	chart := filepath.Join(moduleRoot(t), chartDir)
	files, err := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("want the ci/*-values.yaml files (minimal, everything, job, scaledjob), have %v %v", files, err)
	}
	for _, values := range files {
		name := strings.TrimSuffix(filepath.Base(values), "-values.yaml")
		t.Run(name, func(t *testing.T) {
			runTool(t, chart, nil, helm, "lint", "--strict", ".", "-f", values)
			rendered := runTool(t, chart, nil, helm, "template", "rel", ".", "-f", values)
			vals := readValues(t, chart, values)
			objs := decodeStrict(t, rendered)
			checkChart(t, name, vals, rendered, objs)
		})
	}
}

// TestHelmChartRefuses: the chart fails, with a message naming the value,
// rather than render a pod that cannot start.
func TestHelmChartRefuses(t *testing.T) {
	helm := installHelm(t)
	chart := filepath.Join(moduleRoot(t), chartDir)
	minimal := filepath.Join(chart, "ci", "minimal-values.yaml")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "image.repository is required"},
		{[]string{"-f", minimal, "--set", "image.repository="}, "image.repository is required"},
		{[]string{"-f", minimal, "--set", "engine.url="}, "engine.url is required"},
		{[]string{"-f", minimal, "--set", "token.existingSecret="}, "a worker token is required"},
		{[]string{"-f", minimal, "--set", "token.value=x"}, "not both"},
		{[]string{"-f", minimal, "--set", "mode=daemonset"}, "mode must be deployment, job or scaledJob"},
		{[]string{"-f", minimal, "--set", "mode=scaledJob"}, "keda.triggers is required"},
		{[]string{"-f", minimal, "--set", "drain.enabled=true", "--set", "drain.method=sigquit"}, "drain.method must be preStop or stopSignal"},
		{[]string{"-f", minimal, "--set", "drain.enabled=true", "--set", "terminationGracePeriodSeconds=60"}, "shorter than the drain"},
		{[]string{"-f", minimal, "--set", "sandbox.mode=sometimes"}, `sandbox.mode must be auto, on or off, not "sometimes"`},
		{[]string{"-f", minimal, "--set", "sandbox.mode="}, `sandbox.mode must be auto, on or off, not ""`},
		{[]string{"-f", minimal, "--set-json", `sandbox.binds=["/data","datasets:rw"]`}, `sandbox.binds: "datasets:rw" is not an absolute path`},
		{[]string{"-f", minimal, "--set-json", `sandbox.binds=["/data:rx"]`}, `sandbox.binds: "/data:rx" is not an absolute path, optionally followed by :rw`},
		{[]string{"-f", minimal, "--set", "sandbox.mode=off", "--set", "sandbox.allowNamespaces=true"}, "set sandbox.allowNamespaces false, or sandbox.mode auto or on"},
		{[]string{"-f", minimal, "--set", "hostUsers=maybe"}, `hostUsers must be true, false or null, not "maybe"`},
	} {
		cmd := exec.Command(helm, append([]string{"template", "rel", "."}, c.args...)...)
		cmd.Dir = chart
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("helm template %v: %v, want an error saying %q; got\n%s", c.args, err, c.want, out)
		}
	}
}

// TestHelmChartSandbox: the sandbox values become the worker's --sandbox
// and --sandbox-bind arguments and, with allowNamespaces, a worker
// container whose seccomp and AppArmor profiles let it make a user
// namespace and mount in it (Unconfined, unless the owner set a Localhost
// profile), while the init container keeps the pod's RuntimeDefault; the
// pod's hostUsers only where set. NOTES says how to see whether the pods
// got their sandbox, and warns when it is off.
func TestHelmChartSandbox(t *testing.T) {
	helm := installHelm(t)
	chart := filepath.Join(moduleRoot(t), chartDir)
	minimal := filepath.Join(chart, "ci", "minimal-values.yaml")
	no, yes := false, true
	// YAML 1.1, which Helm reads values in, takes an unquoted on and off
	// for true and false: a user writes them so.
	unquoted := map[string]string{}
	for _, mode := range []string{"on", "off"} {
		unquoted[mode] = filepath.Join(t.TempDir(), mode+".yaml")
		if err := os.WriteFile(unquoted[mode], []byte("sandbox:\n  mode: "+mode+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		set  []string
		want sandboxWant
	}{
		{"defaults", nil, sandboxWant{mode: "auto"}},
		{"on, with binds", []string{"--set", "sandbox.mode=on", "--set-json", `sandbox.binds=["/data","/cache:rw","/models:ro"]`},
			sandboxWant{mode: "on", binds: []string{"/data", "/cache:rw", "/models:ro"}}},
		{"off", []string{"--set", "sandbox.mode=off"}, sandboxWant{mode: "off"}},
		{"mode: on unquoted", []string{"-f", unquoted["on"]}, sandboxWant{mode: "on"}},
		{"mode: off unquoted", []string{"-f", unquoted["off"]}, sandboxWant{mode: "off"}},
		{"allowNamespaces", []string{"--set", "sandbox.allowNamespaces=true"},
			sandboxWant{mode: "auto", seccomp: "Unconfined", appArmor: "Unconfined"}},
		{"allowNamespaces in a Job", []string{"--set", "mode=job", "--set", "sandbox.allowNamespaces=true", "--set", "sandbox.mode=on"},
			sandboxWant{mode: "on", seccomp: "Unconfined", appArmor: "Unconfined"}},
		{"allowNamespaces keeps the container's Localhost seccomp profile",
			[]string{"--set", "sandbox.allowNamespaces=true", "--set-json", `securityContext.seccompProfile={"type":"Localhost","localhostProfile":"profiles/fluksio.json"}`},
			sandboxWant{mode: "auto", seccomp: "Localhost", appArmor: "Unconfined"}},
		{"allowNamespaces keeps the pod's Localhost seccomp profile",
			[]string{"--set", "sandbox.allowNamespaces=true", "--set-json", `podSecurityContext.seccompProfile={"type":"Localhost","localhostProfile":"profiles/fluksio.json"}`},
			sandboxWant{mode: "auto", seccomp: "Localhost", appArmor: "Unconfined"}},
		{"allowNamespaces keeps a Localhost AppArmor profile",
			[]string{"--set", "sandbox.allowNamespaces=true", "--set-json", `securityContext.appArmorProfile={"type":"Localhost","localhostProfile":"fluksio-worker"}`},
			sandboxWant{mode: "auto", seccomp: "Unconfined", appArmor: "Localhost"}},
		{"allowNamespaces overrides a RuntimeDefault set on the container",
			[]string{"--set", "sandbox.allowNamespaces=true", "--set-json", `securityContext.seccompProfile={"type":"RuntimeDefault"}`},
			sandboxWant{mode: "auto", seccomp: "Unconfined", appArmor: "Unconfined"}},
		{"hostUsers false", []string{"--set", "hostUsers=false", "--set", "sandbox.allowNamespaces=true"},
			sandboxWant{mode: "auto", seccomp: "Unconfined", appArmor: "Unconfined", hostUsers: &no}},
		{"hostUsers true", []string{"--set", "hostUsers=true"}, sandboxWant{mode: "auto", hostUsers: &yes}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"template", "rel", ".", "-f", minimal}, c.set...)
			text := runTool(t, chart, nil, helm, args...)
			r := decodeStrict(t, text)
			var spec corev1.PodSpec
			switch {
			case len(r.deployments) == 1:
				spec = r.deployments[0].Spec.Template.Spec
			case len(r.jobs) == 1:
				spec = r.jobs[0].Spec.Template.Spec
			default:
				t.Fatalf("no Deployment or Job rendered:\n%s", text)
			}
			checkSandbox(t, spec, c.want)
			if t.Failed() {
				t.Logf("rendered:\n%s", text)
			}

			// NOTES: how to check, and a warning when off.
			notes := runTool(t, chart, nil, helm, append([]string{"install", "rel", ".", "--dry-run=client", "-f", minimal}, c.set...)...)
			_, notes, _ = strings.Cut(notes, "NOTES:")
			main := spec.Containers[0]
			stateDir := main.Args[slices.Index(main.Args, "--state-dir")+1]
			check := fmt.Sprintf("%s status --state-dir %s", main.Command[0], stateDir)
			if !strings.Contains(notes, check) || !strings.Contains(notes, "sandbox: on") {
				t.Errorf("NOTES do not say how to check the sandbox (%q):\n%s", check, notes)
			}
			if warned := strings.Contains(notes, "calls run with the worker's rights"); warned != (c.want.mode == "off") {
				t.Errorf("NOTES with sandbox.mode %s: warned %v, want %v:\n%s", c.want.mode, warned, c.want.mode == "off", notes)
			}
		})
	}
}

// sandboxWant is what a pod spec should say about the calls' sandbox:
// the worker's --sandbox mode and --sandbox-bind paths in order, the
// profile types the worker container runs under ("" for the pod's
// RuntimeDefault, unchanged), and the pod's hostUsers (nil: left out).
type sandboxWant struct {
	mode              string
	binds             []string
	seccomp, appArmor string
	hostUsers         *bool
}

func checkSandbox(t *testing.T, spec corev1.PodSpec, want sandboxWant) {
	t.Helper()
	initC, main := spec.InitContainers[0], spec.Containers[0]
	var mode []string
	var binds []string
	for i := 0; i+1 < len(main.Args); i++ {
		switch main.Args[i] {
		case "--sandbox":
			mode = append(mode, main.Args[i+1])
		case "--sandbox-bind":
			binds = append(binds, main.Args[i+1])
		}
	}
	if !slices.Equal(mode, []string{want.mode}) || !slices.Equal(binds, want.binds) {
		t.Errorf("--sandbox %v, --sandbox-bind %v; want --sandbox %s once and --sandbox-bind %v", mode, binds, want.mode, want.binds)
	}

	// The profile a container runs under: its own, else the pod's.
	psc := spec.SecurityContext
	seccomp := func(c corev1.Container) string {
		if c.SecurityContext != nil && c.SecurityContext.SeccompProfile != nil {
			return string(c.SecurityContext.SeccompProfile.Type)
		}
		if psc != nil && psc.SeccompProfile != nil {
			return string(psc.SeccompProfile.Type)
		}
		return ""
	}
	appArmor := func(c corev1.Container) string {
		if c.SecurityContext != nil && c.SecurityContext.AppArmorProfile != nil {
			return string(c.SecurityContext.AppArmorProfile.Type)
		}
		if psc != nil && psc.AppArmorProfile != nil {
			return string(psc.AppArmorProfile.Type)
		}
		return ""
	}
	wantSeccomp, wantAppArmor := cmp.Or(want.seccomp, "RuntimeDefault"), want.appArmor
	if got := seccomp(main); got != wantSeccomp {
		t.Errorf("the worker container's seccomp profile is %q, want %q", got, wantSeccomp)
	}
	if got := appArmor(main); got != wantAppArmor {
		t.Errorf("the worker container's AppArmor profile is %q, want %q (\"\": the runtime's default)", got, wantAppArmor)
	}
	// A Localhost profile kept keeps its file.
	if seccomp(main) == "Localhost" {
		p := psc.SeccompProfile
		if main.SecurityContext.SeccompProfile != nil {
			p = main.SecurityContext.SeccompProfile
		}
		if p.LocalhostProfile == nil || *p.LocalhostProfile == "" {
			t.Errorf("the worker container's Localhost seccomp profile lost its file: %+v", p)
		}
	}
	if appArmor(main) == "Localhost" {
		p := psc.AppArmorProfile
		if main.SecurityContext.AppArmorProfile != nil {
			p = main.SecurityContext.AppArmorProfile
		}
		if p.LocalhostProfile == nil || *p.LocalhostProfile == "" {
			t.Errorf("the worker container's Localhost AppArmor profile lost its name: %+v", p)
		}
	}
	// Only the worker is unconfined: the init container copies a file.
	if got := seccomp(initC); got != "RuntimeDefault" && got != "Localhost" {
		t.Errorf("the init container's seccomp profile is %q, want the pod's", got)
	}
	if got := appArmor(initC); got == "Unconfined" {
		t.Error("the init container is unconfined by AppArmor too")
	}
	// Whatever the profiles, the worker keeps the rest: no capabilities,
	// no privilege escalation, a read-only root, non-root.
	sc := main.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("the worker container's securityContext %+v lost what the chart sets besides the profiles", sc)
	}
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("the pod no longer runs as non-root: %+v", psc)
	}

	if (spec.HostUsers == nil) != (want.hostUsers == nil) || (spec.HostUsers != nil && *spec.HostUsers != *want.hostUsers) {
		t.Errorf("hostUsers %v, want %v", formatOr(spec.HostUsers), formatOr(want.hostUsers))
	}
}

// chartValues is what the checks read from a values file, over the
// chart's defaults.
type chartValues struct {
	Image       struct{ Repository, Tag string }
	WorkerImage struct{ Repository, Tag, Digest string } `json:"workerImage"`
	Mode        string
	Token       struct {
		ExistingSecret string `json:"existingSecret"`
		Key            string
		Value          string
	}
	Gpus  int
	Drain struct {
		Enabled        bool
		Method         string
		TimeoutSeconds int `json:"timeoutSeconds"`
	}
	CancelGraceSeconds int `json:"cancelGraceSeconds"`
	Warm               *int
	Preload            []string
	Metrics            struct {
		Port           int
		ServiceMonitor struct{ Enabled bool } `json:"serviceMonitor"`
		PrometheusRule struct{ Enabled bool } `json:"prometheusRule"`
	}

	CallLimits struct {
		MemoryMax string   `json:"memoryMax"`
		PidsMax   *int     `json:"pidsMax"`
		CPUMax    *float64 `json:"cpuMax"`
	} `json:"callLimits"`
	MinFreeDisk string `json:"minFreeDisk"`
	Sandbox     struct {
		Mode            string
		Binds           []string
		AllowNamespaces bool `json:"allowNamespaces"`
	}
	HostUsers *bool `json:"hostUsers"`
}

func readValues(t *testing.T, chart, file string) chartValues {
	t.Helper()
	var v chartValues
	for _, f := range []string{filepath.Join(chart, "values.yaml"), file} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return v
}

// rendered holds the decoded manifests by kind.
type rendered struct {
	deployments    []appsv1.Deployment
	jobs           []batchv1.Job
	secrets        []corev1.Secret
	services       []corev1.Service
	serviceMonitor []serviceMonitor
	scaledJobs     []scaledJob
	prometheusRule []prometheusRule
}

// prometheusRule is prometheus-operator's PrometheusRule: its spec is a
// Prometheus rule file.
type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            ruleFile          `json:"spec"`
}

// ruleFile is a Prometheus rule file, as far as the chart writes one.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// serviceMonitor is the part of prometheus-operator's ServiceMonitor the
// chart writes; anything else in it fails the strict decode.
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// scaledJob is the part of KEDA's ScaledJob (keda.sh/v1alpha1) the chart
// writes; its jobTargetRef is a batch/v1 JobSpec.
type scaledJob struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		PollingInterval            *int32          `json:"pollingInterval"`
		MaxReplicaCount            *int32          `json:"maxReplicaCount"`
		SuccessfulJobsHistoryLimit *int32          `json:"successfulJobsHistoryLimit"`
		FailedJobsHistoryLimit     *int32          `json:"failedJobsHistoryLimit"`
		JobTargetRef               batchv1.JobSpec `json:"jobTargetRef"`
		Triggers                   []struct {
			Type     string            `json:"type"`
			Name     string            `json:"name,omitempty"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// decodeStrict splits helm's output into documents and decodes each into its
// API type, refusing unknown fields.
func decodeStrict(t *testing.T, text string) rendered {
	t.Helper()
	var r rendered
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			t.Fatal(err)
		}
		var into any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			r.deployments = append(r.deployments, appsv1.Deployment{})
			into = &r.deployments[len(r.deployments)-1]
		case "batch/v1 Job":
			r.jobs = append(r.jobs, batchv1.Job{})
			into = &r.jobs[len(r.jobs)-1]
		case "v1 Secret":
			r.secrets = append(r.secrets, corev1.Secret{})
			into = &r.secrets[len(r.secrets)-1]
		case "v1 Service":
			r.services = append(r.services, corev1.Service{})
			into = &r.services[len(r.services)-1]
		case "monitoring.coreos.com/v1 ServiceMonitor":
			r.serviceMonitor = append(r.serviceMonitor, serviceMonitor{})
			into = &r.serviceMonitor[len(r.serviceMonitor)-1]
		case "monitoring.coreos.com/v1 PrometheusRule":
			r.prometheusRule = append(r.prometheusRule, prometheusRule{})
			into = &r.prometheusRule[len(r.prometheusRule)-1]
		case "keda.sh/v1alpha1 ScaledJob":
			r.scaledJobs = append(r.scaledJobs, scaledJob{})
			into = &r.scaledJobs[len(r.scaledJobs)-1]
		default:
			t.Fatalf("the chart renders a %s %s the test does not know\n%s", tm.APIVersion, tm.Kind, doc)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", tm.Kind, err, doc)
		}
	}
	return r
}

func checkChart(t *testing.T, name string, v chartValues, text string, r rendered) {
	// The one pod template of the mode.
	var pod corev1.PodTemplateSpec
	var podLabels map[string]string
	switch v.Mode {
	case "deployment":
		if len(r.deployments) != 1 || len(r.jobs)+len(r.scaledJobs) != 0 {
			t.Fatalf("mode deployment rendered %d Deployments, %d Jobs, %d ScaledJobs", len(r.deployments), len(r.jobs), len(r.scaledJobs))
		}
		d := r.deployments[0]
		pod = d.Spec.Template
		if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, pod.Labels) {
			t.Errorf("the Deployment's selector %v does not select its pods %v", d.Spec.Selector, pod.Labels)
		}
	case "job":
		if len(r.jobs) != 1 || len(r.deployments)+len(r.scaledJobs) != 0 {
			t.Fatalf("mode job rendered %d Jobs, %d Deployments, %d ScaledJobs", len(r.jobs), len(r.deployments), len(r.scaledJobs))
		}
		pod = r.jobs[0].Spec.Template
	case "scaledJob":
		if len(r.scaledJobs) != 1 || len(r.deployments)+len(r.jobs) != 0 {
			t.Fatalf("mode scaledJob rendered %d ScaledJobs, %d Deployments, %d Jobs", len(r.scaledJobs), len(r.deployments), len(r.jobs))
		}
		pod = r.scaledJobs[0].Spec.JobTargetRef.Template
		if len(r.scaledJobs[0].Spec.Triggers) == 0 {
			t.Error("the ScaledJob has no triggers")
		}
	default:
		t.Fatalf("values mode %q", v.Mode)
	}
	podLabels = pod.Labels
	spec := pod.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 1 {
		t.Fatalf("want one init container and one container, have %d and %d", len(spec.InitContainers), len(spec.Containers))
	}
	initC, main := spec.InitContainers[0], spec.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, vol := range spec.Volumes {
		volumes[vol.Name] = vol
	}
	args := append(slices.Clone(main.Command), main.Args...)
	flag := func(name string) (string, bool) {
		i := slices.Index(args, "--"+name)
		if i < 0 || i+1 >= len(args) {
			return "", false
		}
		return args[i+1], true
	}

	// Images: the user's runs, the worker's only copies.
	if !strings.HasPrefix(main.Image, v.Image.Repository+":") {
		t.Errorf("main container image %q, want %s", main.Image, v.Image.Repository)
	}
	if v.WorkerImage.Digest != "" {
		// Pinned: the image pushed by that digest, whatever the tag.
		if want := v.WorkerImage.Repository + "@" + v.WorkerImage.Digest; initC.Image != want {
			t.Errorf("init container image %q, want %s (workerImage.digest)", initC.Image, want)
		}
	} else if !strings.HasPrefix(initC.Image, v.WorkerImage.Repository+":") || strings.HasSuffix(initC.Image, ":") {
		t.Errorf("init container image %q, want %s:TAG", initC.Image, v.WorkerImage.Repository)
	} else if tag := strings.TrimPrefix(initC.Image, v.WorkerImage.Repository+":"); v.WorkerImage.Tag == "" && tag != chartAppVersion(t) {
		t.Errorf("init container image tag %q, want the chart's appVersion %q by default", tag, chartAppVersion(t))
	}

	// The binary: the init container copies it into an emptyDir the main
	// container mounts, and the main container runs it from there with `run`.
	if len(initC.Command) != 3 || initC.Command[0] != "/fluksio-worker" || initC.Command[1] != "copy" {
		t.Fatalf("init container command %v, want [/fluksio-worker copy DIR]", initC.Command)
	}
	copyDir := initC.Command[2]
	binVol := mountedAt(initC, copyDir)
	if binVol == "" || volumes[binVol].EmptyDir == nil {
		t.Fatalf("the init container copies to %s, which is not an emptyDir it mounts (%v)", copyDir, initC.VolumeMounts)
	}
	var mainBinDir string
	for _, m := range main.VolumeMounts {
		if m.Name == binVol {
			mainBinDir = m.MountPath
		}
	}
	if mainBinDir == "" {
		t.Fatalf("the main container does not mount the binary's volume %s", binVol)
	}
	if len(main.Command) == 0 || main.Command[0] != path.Join(mainBinDir, "fluksio-worker") || len(main.Args) == 0 || main.Args[0] != "run" {
		t.Errorf("main container runs %v %v, want %s run …", main.Command, main.Args, path.Join(mainBinDir, "fluksio-worker"))
	}

	// The token: a file from a Secret, nowhere else.
	if _, ok := flag("token"); ok {
		t.Error("the worker is given --token: the token would be in the process list")
	}
	tokenFile, ok := flag("token-file")
	if !ok {
		t.Fatalf("no --token-file in %v", args)
	}
	tokenVol := mountedAt(main, path.Dir(tokenFile))
	sec := volumes[tokenVol].Secret
	if tokenVol == "" || sec == nil {
		t.Fatalf("--token-file %s is not in a Secret volume (mounts %v)", tokenFile, main.VolumeMounts)
	}
	wantSecret := v.Token.ExistingSecret
	if wantSecret == "" {
		wantSecret = "rel-fluksio-worker-token"
	}
	if sec.SecretName != wantSecret || len(sec.Items) != 1 || sec.Items[0].Key != v.Token.Key || sec.Items[0].Path != path.Base(tokenFile) {
		t.Errorf("token volume %+v, want Secret %s key %s as %s", sec, wantSecret, v.Token.Key, path.Base(tokenFile))
	}
	if sec.DefaultMode == nil || *sec.DefaultMode&0o007 != 0 {
		t.Errorf("the token file's mode %v is world-readable", sec.DefaultMode)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("%s: env %s comes from a Secret; the token is only a file", c.Name, e.Name)
			}
			if strings.Contains(strings.ToUpper(e.Name), "TOKEN") {
				t.Errorf("%s: env %s looks like a token", c.Name, e.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				t.Errorf("%s: envFrom a Secret", c.Name)
			}
		}
		if c.Name != main.Name && mountedAt(c, path.Dir(tokenFile)) != "" {
			t.Errorf("%s mounts the token too", c.Name)
		}
	}
	if v.Token.Value != "" {
		if strings.Count(text, v.Token.Value) != 0 {
			t.Errorf("the token %q appears in the rendered manifests in clear", v.Token.Value)
		}
		if len(r.secrets) != 1 || r.secrets[0].Name != wantSecret || string(r.secrets[0].Data[v.Token.Key]) != v.Token.Value {
			t.Errorf("token.value: want one Secret %s holding it under %s, have %+v", wantSecret, v.Token.Key, r.secrets)
		}
	} else if len(r.secrets) != 0 {
		t.Errorf("token.existingSecret: the chart should create no Secret, creates %d", len(r.secrets))
	}

	// Health and metrics: the probe and the port are the worker's --listen.
	listen, ok := flag("listen")
	if !ok {
		t.Fatalf("no --listen in %v", args)
	}
	host, portText, _ := strings.Cut(listen, ":")
	port, _ := strconv.Atoi(portText)
	// Every address of the pod, of either family: "0.0.0.0" would be
	// IPv4 only, out of reach on an IPv6-only cluster.
	if host != "" || port != v.Metrics.Port {
		t.Errorf("--listen %s, want :%d (reachable by the kubelet's probe and Prometheus over IPv4 and IPv6)", listen, v.Metrics.Port)
	}
	// Liveness and startup ask /livez (the worker's main loop), readiness
	// /healthz (attached): an engine outage makes pods unready, never
	// restarts them.
	for _, p := range []struct {
		kind, path string
		probe      *corev1.Probe
	}{{"startup", "/livez", main.StartupProbe}, {"liveness", "/livez", main.LivenessProbe}, {"readiness", "/healthz", main.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s probe %+v, want an HTTP GET of %s", p.kind, p.probe, p.path)
			continue
		}
		if got := containerPort(t, main, p.probe.HTTPGet.Port.String()); got != port {
			t.Errorf("the %s probe asks port %d, the worker listens on %d", p.kind, got, port)
		}
	}
	if pod.Annotations["prometheus.io/port"] != strconv.Itoa(port) || pod.Annotations["prometheus.io/scrape"] != "true" {
		t.Errorf("pod annotations %v do not point Prometheus at %d", pod.Annotations, port)
	}
	if v.Metrics.ServiceMonitor.Enabled {
		if len(r.serviceMonitor) != 1 || len(r.services) != 1 {
			t.Fatalf("serviceMonitor: %d ServiceMonitors, %d Services", len(r.serviceMonitor), len(r.services))
		}
		svc, sm := r.services[0], r.serviceMonitor[0]
		if !selects(svc.Spec.Selector, podLabels) {
			t.Errorf("the metrics Service selects %v, the pods are %v", svc.Spec.Selector, podLabels)
		}
		if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
			t.Errorf("the ServiceMonitor selects %v, the Service is %v", sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		if len(svc.Spec.Ports) != 1 || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name ||
			containerPort(t, main, svc.Spec.Ports[0].TargetPort.String()) != port || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("the ServiceMonitor/Service do not reach /metrics on %d: %+v %+v", port, svc.Spec.Ports, sm.Spec.Endpoints)
		}
	} else if len(r.serviceMonitor)+len(r.services) != 0 {
		t.Errorf("no serviceMonitor asked for, %d rendered", len(r.serviceMonitor))
	}

	// Alerts: the rules shipped in packaging/monitoring, as they are.
	if v.Metrics.PrometheusRule.Enabled {
		checkPrometheusRule(t, r)
	} else if len(r.prometheusRule) != 0 {
		t.Errorf("no prometheusRule asked for, %d rendered", len(r.prometheusRule))
	}

	// Stopping: the grace period covers the drain, then the cancel grace.
	cg, ok := flag("cancel-grace")
	if !ok {
		cg = "3s"
	}
	cancelGrace, err := time.ParseDuration(cg)
	if err != nil {
		t.Fatalf("--cancel-grace %q: %v", cg, err)
	}
	if cancelGrace != time.Duration(v.CancelGraceSeconds)*time.Second {
		t.Errorf("--cancel-grace %s, values say %ds", cg, v.CancelGraceSeconds)
	}
	var drain time.Duration
	if v.Drain.Enabled {
		drain = time.Duration(v.Drain.TimeoutSeconds) * time.Second
		lc := main.Lifecycle
		switch v.Drain.Method {
		case "preStop":
			if lc == nil || lc.PreStop == nil || lc.PreStop.Exec == nil || !strings.Contains(strings.Join(lc.PreStop.Exec.Command, " "), "kill -QUIT 1") {
				t.Errorf("drain.enabled: want a preStop hook sending SIGQUIT to the worker, have %+v", lc)
			}
		case "stopSignal":
			if lc == nil || lc.StopSignal == nil || *lc.StopSignal != corev1.SIGQUIT || lc.PreStop != nil {
				t.Errorf("drain.method stopSignal: want lifecycle.stopSignal SIGQUIT alone, have %+v", lc)
			}
			if spec.OS == nil || spec.OS.Name != corev1.Linux {
				t.Errorf("a stop signal needs spec.os.name, have %+v", spec.OS)
			}
		default:
			t.Errorf("drain.method %q", v.Drain.Method)
		}
	} else if main.Lifecycle != nil {
		t.Errorf("no drain asked for, but %+v", main.Lifecycle)
	}
	grace := spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second < drain+cancelGrace {
		t.Errorf("terminationGracePeriodSeconds %v < drain %v + cancel grace %v", grace, drain, cancelGrace)
	}

	// Spares: --warm only when set (0 is set), --preload the list.
	warm, hasWarm := flag("warm")
	if (v.Warm == nil) != !hasWarm || (v.Warm != nil && warm != strconv.Itoa(*v.Warm)) {
		t.Errorf("--warm %q (given: %v), values say %v", warm, hasWarm, v.Warm)
	}
	if preload, _ := flag("preload"); preload != strings.Join(v.Preload, ",") {
		t.Errorf("--preload %q, values say %v", preload, v.Preload)
	}

	// Per-call limits and the free disk: each flag only when set.
	for name, want := range map[string]string{"call-memory-max": v.CallLimits.MemoryMax, "min-free-disk": v.MinFreeDisk,
		"call-pids-max": formatOr(v.CallLimits.PidsMax), "call-cpu-max": formatOr(v.CallLimits.CPUMax)} {
		if got, _ := flag(name); got != want {
			t.Errorf("--%s %q, values say %q", name, got, want)
		}
	}

	// GPUs: the limit and what the worker advertises agree.
	if got, _ := flag("gpus"); got != strconv.Itoa(v.Gpus) {
		t.Errorf("--gpus %q, want %d", got, v.Gpus)
	}
	q, has := main.Resources.Limits["nvidia.com/gpu"]
	if v.Gpus > 0 && (!has || !q.Equal(*resource.NewQuantity(int64(v.Gpus), resource.DecimalSI))) {
		t.Errorf("nvidia.com/gpu limit %v, want %d", main.Resources.Limits, v.Gpus)
	}
	if v.Gpus == 0 && has {
		t.Errorf("gpus 0 but a GPU limit %v", q)
	}

	// State on an emptyDir; non-root; a read-only root.
	stateDir, _ := flag("state-dir")
	if vol := mountedAt(main, stateDir); stateDir == "" || vol == "" || volumes[vol].EmptyDir == nil {
		t.Errorf("--state-dir %q is not on an emptyDir", stateDir)
	}
	if vol := mountedAt(main, "/tmp"); vol == "" || volumes[vol].EmptyDir == nil {
		t.Error("/tmp is not a writable emptyDir (the root filesystem is read-only)")
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("the pod does not run as non-root: %+v", psc)
	}
	for _, c := range []corev1.Container{initC, main} {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: securityContext %+v, want a read-only root and no privilege escalation", c.Name, sc)
		}
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token; the worker needs no API access")
	}

	// The calls' sandbox, as the values say.
	unconfined := ""
	if v.Sandbox.AllowNamespaces {
		unconfined = "Unconfined"
	}
	checkSandbox(t, spec, sandboxWant{mode: v.Sandbox.Mode, binds: v.Sandbox.Binds, seccomp: unconfined, appArmor: unconfined, hostUsers: v.HostUsers})

	// One-shot workers are bounded and not restarted in place.
	if v.Mode != "deployment" {
		if _, ok := flag("max-calls"); !ok {
			if _, ok := flag("max-idle"); !ok {
				t.Errorf("mode %s: neither --max-calls nor --max-idle in %v", v.Mode, args)
			}
		}
		if spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("mode %s: restartPolicy %q, want Never", v.Mode, spec.RestartPolicy)
		}
	} else if _, ok := flag("max-calls"); ok {
		t.Error("a Deployment's workers must not exit after --max-calls (they would be restarted)")
	}
	t.Logf("%s: %s, grace %ds, --listen %s, token %s", name, v.Mode, *grace, listen, tokenFile)
}

// checkPrometheusRule: the chart's one PrometheusRule holds the rules of
// packaging/monitoring/fluksio-worker.rules.yaml, and promtool (where
// installed) accepts them as the chart renders them.
func checkPrometheusRule(t *testing.T, r rendered) {
	t.Helper()
	if len(r.prometheusRule) != 1 {
		t.Fatalf("prometheusRule.enabled: %d PrometheusRules rendered, want 1", len(r.prometheusRule))
	}
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), monitoringDir, "fluksio-worker.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var shipped ruleFile
	if err := yaml.UnmarshalStrict(b, &shipped); err != nil {
		t.Fatalf("the shipped rules: %v", err)
	}
	got := r.prometheusRule[0].Spec
	if want := mustJSON(t, shipped); !bytes.Equal(mustJSON(t, got), want) || len(got.Groups) == 0 {
		t.Errorf("the PrometheusRule's rules differ from packaging/monitoring's:\n%s\nwant\n%s", mustJSON(t, got), want)
	}
	if _, err := exec.LookPath("promtool"); err != nil {
		return
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	out, _ := yaml.Marshal(got)
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	runTool(t, "", nil, "promtool", "check", "rules", file)
}

// mountedAt is the volume c mounts at dir, or "".
func mountedAt(c corev1.Container, dir string) string {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) {
			return m.Name
		}
	}
	return ""
}

// containerPort resolves a port name or number against c's ports.
func containerPort(t *testing.T, c corev1.Container, port string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
			return int(p.ContainerPort)
		}
	}
	t.Errorf("%s declares no port %q (%v)", c.Name, port, c.Ports)
	return -1
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// installHelm finds the pinned Helm: on PATH if that one is the right
// version (CI installs it), else installed into a cache directory once.
func installHelm(t *testing.T) string {
	t.Helper()
	waitForCITools(t)
	version := helmModule[strings.LastIndex(helmModule, "@")+1:]
	// A `go install`ed helm reports only "v4.3" itself; its build info
	// has the module's version.
	if exe, err := exec.LookPath("helm"); err == nil {
		out, _ := exec.Command("go", "version", "-m", exe).Output()
		if regexp.MustCompile(`(?m)^\s+mod\s+helm\.sh/helm/v4\s+` + regexp.QuoteMeta(version) + `\s`).Match(out) {
			return exe
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "fluksio-worker-test", "helm-"+version)
	exe := filepath.Join(bin, "helm")
	if _, err := os.Stat(exe); err == nil {
		return exe
	}
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skipf("helm %s is not installed (go install %s); skipped with -short", version, helmModule)
	}
	start := time.Now()
	cmd := exec.Command("go", "install", helmModule)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("go install %s: %v\n%s", helmModule, err, out)
		}
		t.Skipf("cannot install %s (offline?): %v\n%s", helmModule, err, out)
	}
	t.Logf("installed helm %s in %v", version, time.Since(start).Round(time.Second))
	return exe
}

// TestHelmChartPodRuns runs the rendered pod spec without a kubelet: each
// volume is a directory (the Secret's a file holding the token, with the
// Secret volume's mode), the init container's command copies the worker
// binary into the binary's emptyDir, and the main container's command and
// arguments, paths mapped onto those directories, attach to a test engine
// and run a call; the liveness probe's URL answers 200. The Deployment is
// then stopped the way the kubelet does with the drain on (its preStop hook,
// pointed at the worker's pid instead of 1) while a call runs: the call
// finishes and the worker exits 0 within the grace period. The Job's worker
// (--max-calls 1) exits 0 after its one call. What is not run: images,
// namespaces, users, the read-only root (no kubelet or container runtime
// here; kind and k3s need Docker).
func TestHelmChartPodRuns(t *testing.T) {
	helm := installHelm(t)
	help, _ := exec.Command(workerBinary(t), "run", "--help").CombinedOutput()
	for _, f := range []string{"--listen", "--max-calls"} {
		if !strings.Contains(string(help), f+" ") {
			t.Skipf("this worker has no %s yet (the monitoring issue adds it); the chart's pod needs it", f)
		}
	}
	chart := filepath.Join(moduleRoot(t), chartDir)
	minimal := filepath.Join(chart, "ci", "minimal-values.yaml")
	for _, mode := range []string{"deployment", "job"} {
		t.Run(mode, func(t *testing.T) {
			eng := startEngine(t, enginetest.Options{})
			port := freePort(t)
			out := runTool(t, chart, nil, helm, "template", "rel", ".", "-f", minimal,
				"--set", "mode="+mode, "--set", "engine.url="+eng.AttachURL(),
				"--set", "python="+fakeRunnerPath(t), "--set", "metrics.port="+strconv.Itoa(port),
				"--set", "drain.enabled=true", "--set", "drain.timeoutSeconds=60",
				"--set", "oneShot.maxCalls=1", "--set-json", `extraArgs=["--runtime","embedded","--health-grace","1s"]`,
				// Probes at the kubelet's smallest period, so an outage
				// longer than the liveness window takes seconds.
				"--set", "livenessProbe.periodSeconds=1", "--set", "livenessProbe.failureThreshold=3",
				"--set", "readinessProbe.periodSeconds=1", "--set", "readinessProbe.failureThreshold=1")
			r := decodeStrict(t, out)
			var spec corev1.PodSpec
			if mode == "job" {
				spec = r.jobs[0].Spec.Template.Spec
			} else {
				spec = r.deployments[0].Spec.Template.Spec
			}
			dirs := map[string]string{}
			for _, vol := range spec.Volumes {
				dir := filepath.Join(t.TempDir(), vol.Name)
				if err := os.MkdirAll(dir, 0o777); err != nil {
					t.Fatal(err)
				}
				if s := vol.Secret; s != nil {
					for _, it := range s.Items {
						if err := os.WriteFile(filepath.Join(dir, it.Path), []byte(testToken+"\n"), os.FileMode(*s.DefaultMode)); err != nil {
							t.Fatal(err)
						}
					}
				}
				dirs[vol.Name] = dir
			}
			mapper := func(c corev1.Container) func(string) string {
				return func(p string) string {
					if p == fakeRunnerPath(t) {
						return p // the image's Python: here, on the host
					}
					for _, m := range c.VolumeMounts {
						if p == m.MountPath || strings.HasPrefix(p, m.MountPath+"/") {
							return dirs[m.Name] + strings.TrimPrefix(p, m.MountPath)
						}
					}
					return p
				}
			}

			// The init container; the image's /fluksio-worker is the binary
			// under test.
			initC := spec.InitContainers[0]
			initArgs := mapAll(initC.Command[1:], mapper(initC))
			if out, err := exec.Command(workerBinary(t), initArgs...).CombinedOutput(); err != nil {
				t.Fatalf("init container %v: %v\n%s", initC.Command, err, out)
			}

			main := spec.Containers[0]
			m := mapper(main)
			cmd := mapAll(append(slices.Clone(main.Command), main.Args...), m)
			var env []string
			for _, e := range main.Env {
				env = append(env, e.Name+"="+e.Value)
			}
			w := startProgram(t, cmd[0], env, cmd[1:]...)
			wk := attach(t, eng)

			eventually(t, 10*time.Second, "the startup probe answers 200", func() bool {
				return probeOK(t, main, main.StartupProbe)
			})
			eventually(t, 10*time.Second, "the readiness probe answers 200 once attached", func() bool {
				return probeOK(t, main, main.ReadinessProbe)
			})

			grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
			if mode == "job" {
				answer, _ := wait(t, run(t, wk, "j1", step{"sleep_ms": 200}))
				if !answer.OK {
					t.Fatal(string(answer.Raw))
				}
				if code := w.wait(30 * time.Second); code != 0 {
					t.Fatalf("the one-shot worker exited %d after its call, want 0", code)
				}
				return
			}
			wk = outlastLiveness(t, eng, main)

			// A call is running when the pod is deleted: the preStop hook
			// drains, the call finishes, the worker exits 0.
			call := run(t, wk, "d1", step{"sleep_ms": 3000})
			time.Sleep(500 * time.Millisecond)
			hook := strings.Join(main.Lifecycle.PreStop.Exec.Command, "\x00")
			pid := strconv.Itoa(w.cmd.Process.Pid)
			hook = strings.NewReplacer("kill -QUIT 1", "kill -QUIT "+pid, "kill -0 1", "kill -0 "+pid).Replace(hook)
			argv := strings.Split(hook, "\x00")
			preStop := exec.Command(argv[0], argv[1:]...)
			start := time.Now()
			if err := preStop.Start(); err != nil {
				t.Fatal(err)
			}
			answer, _ := wait(t, call)
			if !answer.OK {
				t.Errorf("the call running at the drain: %s", answer.Raw)
			}
			if code := w.wait(grace); code != 0 {
				t.Errorf("drained worker exited %d, want 0", code)
			}
			if err := preStop.Wait(); err != nil {
				t.Errorf("the preStop hook: %v", err)
			}
			t.Logf("drained in %v (grace %v)", time.Since(start).Round(time.Millisecond), grace)
		})
	}
}

// outlastLiveness takes the engine away for longer than c's liveness
// window while a kubelet probes c as the chart says: the pod must turn
// unready, be ready again once the worker has reattached, and never be
// restarted. It returns the reattached worker.
func outlastLiveness(t *testing.T, eng *enginetest.Engine, c corev1.Container) *enginetest.Worker {
	t.Helper()
	kubelet := startKubelet(t, c)
	window := time.Duration(c.LivenessProbe.PeriodSeconds*c.LivenessProbe.FailureThreshold) * time.Second
	if err := eng.Restart(window + 3*time.Second); err != nil {
		t.Fatal(err)
	}
	wk := attach(t, eng)
	eventually(t, 20*time.Second, "the pod to be ready again after the outage", kubelet.ready)
	if restarts, unready := kubelet.stop(); restarts != 0 || unready == 0 {
		t.Errorf("through an engine outage of %v (liveness window %v): %d restarts, %d turns unready; want none and at least one",
			window+3*time.Second, window, restarts, unready)
	}
	return wk
}

// probeOK asks an HTTP probe of c, on the host's loopback, as the kubelet
// would: 2xx or 3xx within its timeout is success.
func probeOK(t *testing.T, c corev1.Container, p *corev1.Probe) bool {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d%s", containerPort(t, c, p.HTTPGet.Port.String()), p.HTTPGet.Path)
	client := http.Client{Timeout: time.Duration(max(p.TimeoutSeconds, 1)) * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// kubelet probes a running container's liveness and readiness as the
// kubelet does, each every periodSeconds: failureThreshold failures in a row
// would restart the container (liveness) or mark the pod unready
// (readiness). Nothing is restarted; the counts are what a kubelet would
// have done.
type kubelet struct {
	mu                sync.Mutex
	restarts, unready int
	isReady           bool
	done              chan struct{}
	wg                sync.WaitGroup
}

func startKubelet(t *testing.T, c corev1.Container) *kubelet {
	k := &kubelet{isReady: true, done: make(chan struct{})}
	loop := func(p *corev1.Probe, failed func()) {
		defer k.wg.Done()
		tick := time.NewTicker(time.Duration(p.PeriodSeconds) * time.Second)
		defer tick.Stop()
		inRow := 0
		for {
			select {
			case <-k.done:
				return
			case <-tick.C:
			}
			if probeOK(t, c, p) {
				inRow = 0
				if p == c.ReadinessProbe {
					k.mu.Lock()
					k.isReady = true
					k.mu.Unlock()
				}
				continue
			}
			if inRow++; inRow == int(p.FailureThreshold) {
				k.mu.Lock()
				failed()
				k.mu.Unlock()
			}
		}
	}
	k.wg.Add(2)
	go loop(c.LivenessProbe, func() { k.restarts++ })
	go loop(c.ReadinessProbe, func() { k.unready++; k.isReady = false })
	return k
}

// ready is whether the last readiness probes left the pod ready.
func (k *kubelet) ready() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.isReady
}

// stop ends the probing and says how often liveness would have restarted
// the container and readiness turned the pod unready.
func (k *kubelet) stop() (restarts, unready int) {
	close(k.done)
	k.wg.Wait()
	return k.restarts, k.unready
}

func mapAll(args []string, m func(string) string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = m(a)
	}
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestTokenFileFromASecret: the chart mounts the token as Kubernetes mounts
// a Secret with defaultMode 0440 and an fsGroup (owned by root, group the
// pod's fsGroup), and the worker runs as uid 1000 in that group: it reads
// the file through its group and cannot chmod it, so no warning. A token
// every user may read, or one the worker owns and leaves group-readable,
// still draws the warning with the chmod that fixes it.
func TestTokenFileFromASecret(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("files owned by root read by another uid: run as root")
	}
	const uid, gid = 1000, 1000
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "fluksio-worker")
	b, err := os.ReadFile(workerBinary(t))
	if err == nil {
		err = os.WriteFile(bin, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		owner      int
		mode       os.FileMode
		wantNotice bool
	}{
		{"secret volume 0440 root:fsGroup", 0, 0o440, false},
		{"every user may read it", 0, 0o444, true},
		{"the worker's own file, group-readable", uid, 0o640, true},
		{"the worker's own file, private", uid, 0o600, false},
	} {
		token := filepath.Join(dir, fmt.Sprintf("token-%o-%d", c.mode, c.owner))
		if err := os.WriteFile(token, []byte(testToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(token, c.owner, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(token, c.mode); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "check", "--url", "ws://127.0.0.1:1/api/v1/workers/attach", "--token-file", token, "--python", "/usr/bin/python3")
		cmd.Env = append(cleanEnv(), "HOME="+dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid}}}
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), "config") || strings.Contains(string(out), "reading the token file") {
			t.Errorf("%s: check did not get past the token:\n%s", c.name, out)
			continue
		}
		warned := strings.Contains(string(out), "holds the token and is mode") && strings.Contains(string(out), "chmod 600 "+token)
		if warned != c.wantNotice {
			t.Errorf("%s (mode %04o, owner %d, group %d, worker %d:%d): warned %v, want %v\n%s", c.name, c.mode, c.owner, gid, uid, gid, warned, c.wantNotice, out)
		}
	}
}

// TestChartVersionFollowsTheRelease: the chart's appVersion is the worker
// image's default tag, and a release whose chart says another version is
// refused before anything is built: packaging/helm/check-version.sh, run by
// GoReleaser's before hook for a release (a tagged commit whose tag is not
// the chart's appVersion fails `goreleaser build` with the script's
// message), accepts the chart's own version.
func TestChartVersionFollowsTheRelease(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	appVersion := chartAppVersion(t)
	check := filepath.Join(root, "packaging", "helm", "check-version.sh")
	runTool(t, root, nil, "sh", check, appVersion)
	out, err := exec.Command("sh", check, "99.1.0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `appVersion "`+appVersion+`", but this release is 99.1.0`) {
		t.Errorf("check-version.sh 99.1.0 with appVersion %s: %v, %s; want a refusal naming both", appVersion, err, out)
	}
	if testing.Short() {
		return
	}

	// GoReleaser runs it: a copy of the tree, committed and tagged with
	// another version than the chart's.
	goreleaser := installGoreleaser(t)
	tree := t.TempDir()
	files, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(strings.TrimSpace(string(files)), "\n") {
		src, dst := filepath.Join(root, f), filepath.Join(tree, f)
		st, err := os.Lstat(src)
		if err != nil {
			continue // deleted, not yet staged
		}
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if st.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(src)
			err = os.Symlink(target, dst)
		} else if b, rerr := os.ReadFile(src); rerr == nil {
			err = os.WriteFile(dst, b, st.Mode().Perm())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	git := []string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}
	runTool(t, tree, nil, "git", "init", "-q")
	runTool(t, tree, nil, "git", append(git, "add", "-A")...)
	runTool(t, tree, nil, "git", append(git, "commit", "-q", "-m", "release")...)
	runTool(t, tree, nil, "git", append(git, "tag", "v99.1.0")...)
	runTool(t, tree, nil, "git", "remote", "add", "origin", "https://github.com/fluksio/fluksio-worker.git")
	cmd := exec.Command(goreleaser, "build", "--single-target", "--clean", "--skip=validate")
	cmd.Dir = tree
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "but this release is 99.1.0") {
		t.Errorf("goreleaser build of v99.1.0 with the chart at %s: %v; want the refusal\n%s", appVersion, err, out)
	}
}

// chartAppVersion is the chart's appVersion, the worker image's default tag.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), chartDir, "Chart.yaml"))
	if err == nil {
		err = yaml.Unmarshal(b, &meta)
	}
	if err != nil || meta.AppVersion == "" {
		t.Fatalf("Chart.yaml: no appVersion (%v)", err)
	}
	return meta.AppVersion
}

// formatOr is *p as text, "" for nil.
func formatOr[T int | float64 | bool](p *T) string {
	if p == nil {
		return ""
	}
	return fmt.Sprint(*p)
}
