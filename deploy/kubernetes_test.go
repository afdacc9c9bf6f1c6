package deploy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/couchq/couchq/fleet"
	"github.com/couchq/couchq/worker"
)

// k8sObject is what the test reads of a manifest: enough to follow every
// reference between them.
type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       yaml.Node         `yaml:"spec"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
		ShareProcessNamespace         bool `yaml:"shareProcessNamespace"`
		SecurityContext               struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
			RunAsUser    int  `yaml:"runAsUser"`
			RunAsGroup   int  `yaml:"runAsGroup"`
		} `yaml:"securityContext"`
		Containers []container `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
				Items      []struct {
					Key  string `yaml:"key"`
					Path string `yaml:"path"`
				} `yaml:"items"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
}

// port is the container port a probe or Service names, by name or number;
// 0 when the container has none such.
func (c container) port(ref yaml.Node) int {
	for _, p := range c.Ports {
		if ref.Value == p.Name || ref.Value == strconv.Itoa(p.ContainerPort) {
			return p.ContainerPort
		}
	}
	return 0
}

// env is the value the container sets for an environment variable.
func (c container) env(name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// readManifests parses every YAML document of deploy/kubernetes.
func readManifests(t *testing.T) []*k8sObject {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	var objs []*k8sObject
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(src)))
		for {
			o := &k8sObject{file: filepath.Base(f)}
			err := dec.Decode(o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// imageUser is the Dockerfile's USER, as UID and GID.
func imageUser(t *testing.T) (uid, gid int) {
	t.Helper()
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER (\d+):(\d+)\s*$`).FindStringSubmatch(string(src))
	if m == nil {
		t.Fatal("the Dockerfile has no USER UID:GID")
	}
	uid, _ = strconv.Atoi(m[1])
	gid, _ = strconv.Atoi(m[2])
	return uid, gid
}

// loadWorkerConfig loads a worker config file with fleet's loader, the
// password file it names replaced (it exists only where deployed) and no
// connection settings from the test's environment.
func loadWorkerConfig(t *testing.T, path string) *fleet.Config {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"COUCHDB_URL", "COUCHDB_USER", "COUCHDB_PASSWORD", "COUCHQ_DB", "COUCHQ_SITE"} {
		t.Setenv(k, "")
	}
	t.Setenv("COUCHDB_PASSWORD_FILE", pw)
	cfg, err := fleet.Load(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	return cfg
}

func typeNames(cfg *fleet.Config) []string {
	var names []string
	for _, typ := range cfg.Types {
		names = append(names, typ.Name)
	}
	slices.Sort(names)
	return names
}

// passwordFile is the password_file of a workers.toml's [couchdb] table.
func passwordFile(toml string) string {
	m := regexp.MustCompile(`(?m)^password_file\s*=\s*"([^"]+)"`).FindStringSubmatch(toml)
	if m == nil {
		return ""
	}
	return m[1]
}

// The Kubernetes manifests parse and name only what exists: a Deployment
// per job type of the ConfigMap's workers.toml (which fleet loads, with the
// types and shutdown_timeout of deploy/workers.toml), couchq commands and
// flags, the image's user, the ports the worker and serve listen on, probe
// paths the worker's health handler serves, a grace period above the
// shutdown timeout, the Secret and ConfigMap the pods mount, and a metric
// couchq exports for the autoscaler.
func TestKubernetesManifestsNameOnlyWhatExists(t *testing.T) {
	bin := couchqBinary(t)
	objs := readManifests(t)
	byKind := map[string][]*k8sObject{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	find := func(kind, name string) *k8sObject {
		for _, o := range byKind[kind] {
			if o.Metadata.Name == name {
				return o
			}
		}
		return nil
	}

	// kustomization.yaml lists files that exist; every manifest is in it
	// or named there as optional.
	kust, err := os.ReadFile("kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(kust, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join("kubernetes", r)); err != nil {
			t.Errorf("kustomization.yaml: %v", err)
		}
	}
	for _, o := range objs {
		if !slices.Contains(k.Resources, o.file) && !strings.Contains(string(kust), "#   "+o.file) {
			t.Errorf("%s is neither a resource of kustomization.yaml nor named there as optional", o.file)
		}
	}

	// The worker config: the ConfigMap's workers.toml, as fleet loads it.
	cm := find("ConfigMap", "couchq-workers")
	if cm == nil || cm.Data["workers.toml"] == "" {
		t.Fatal("no ConfigMap couchq-workers with a workers.toml")
	}
	toml := filepath.Join(t.TempDir(), "workers.toml")
	if err := os.WriteFile(toml, []byte(cm.Data["workers.toml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := loadWorkerConfig(t, toml)
	base := loadWorkerConfig(t, "workers.toml")
	if got, want := typeNames(cfg), typeNames(base); !slices.Equal(got, want) {
		t.Errorf("the ConfigMap's workers.toml runs types %v, deploy/workers.toml %v", got, want)
	}
	if cfg.ShutdownTimeout != base.ShutdownTimeout {
		t.Errorf("the ConfigMap's shutdown_timeout %s, deploy/workers.toml's %s", cfg.ShutdownTimeout, base.ShutdownTimeout)
	}
	_, healthPort, err := net.SplitHostPort(cfg.HealthAddr)
	if err != nil {
		t.Fatalf("the ConfigMap's health_addr %q: %v", cfg.HealthAddr, err)
	}
	types := map[string]bool{}
	for _, n := range typeNames(cfg) {
		types[n] = true
	}

	// The paths the worker's health handler serves.
	health := httptest.NewServer(worker.HealthHandler())
	defer health.Close()
	served := func(path string) bool {
		resp, err := http.Get(health.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode != http.StatusNotFound
	}

	uid, gid := imageUser(t)
	connHelp := helpOf(t, bin, "init")
	serveHelp := helpOf(t, bin, "serve")
	ran := map[string]bool{}
	deployments := map[string]podTemplate{}
	for _, d := range byKind["Deployment"] {
		var spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template podTemplate `yaml:"template"`
		}
		if err := d.Spec.Decode(&spec); err != nil {
			t.Fatalf("Deployment %s: %v", d.Metadata.Name, err)
		}
		deployments[d.Metadata.Name] = spec.Template
		for k, v := range spec.Selector.MatchLabels {
			if spec.Template.Metadata.Labels[k] != v {
				t.Errorf("Deployment %s: the selector's %s=%s is not on its pods", d.Metadata.Name, k, v)
			}
		}
	}
	for _, j := range byKind["Job"] {
		var spec struct {
			Template podTemplate `yaml:"template"`
		}
		if err := j.Spec.Decode(&spec); err != nil {
			t.Fatalf("Job %s: %v", j.Metadata.Name, err)
		}
		deployments["job/"+j.Metadata.Name] = spec.Template
	}
	for name, pod := range deployments {
		sc := pod.Spec.SecurityContext
		if !sc.RunAsNonRoot || sc.RunAsUser != uid || sc.RunAsGroup != gid {
			t.Errorf("%s: runs as %d:%d (non-root %v); the image's user is %d:%d", name, sc.RunAsUser, sc.RunAsGroup, sc.RunAsNonRoot, uid, gid)
		}
		mounts := map[string]string{} // mount path: volume
		for _, c := range pod.Spec.Containers {
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m.Name
			}
		}
		secretFiles := map[string]bool{}
		for _, v := range pod.Spec.Volumes {
			if v.ConfigMap != nil && find("ConfigMap", v.ConfigMap.Name) == nil {
				t.Errorf("%s: volume %s: no ConfigMap %s", name, v.Name, v.ConfigMap.Name)
			}
			if v.Secret == nil {
				continue
			}
			secret := find("Secret", v.Secret.SecretName)
			if secret == nil {
				t.Errorf("%s: volume %s: no Secret %s", name, v.Name, v.Secret.SecretName)
				continue
			}
			for _, it := range v.Secret.Items {
				if _, ok := secret.StringData[it.Key]; !ok {
					t.Errorf("%s: volume %s: Secret %s has no key %s", name, v.Name, secret.Metadata.Name, it.Key)
				}
				for path, vol := range mounts {
					if vol == v.Name {
						secretFiles[filepath.Join(path, it.Path)] = true
					}
				}
			}
		}
		for _, c := range pod.Spec.Containers {
			if !strings.HasPrefix(c.Image, "couchq:") {
				continue
			}
			where := name + " container " + c.Name
			checkArgs(t, bin, where, c.Args)
			for _, e := range c.Env {
				if !strings.Contains(connHelp, "$"+e.Name) {
					t.Errorf("%s: couchq reads no $%s", where, e.Name)
				}
			}
			if f := c.env("COUCHDB_PASSWORD_FILE"); f != "" && !secretFiles[f] {
				t.Errorf("%s: COUCHDB_PASSWORD_FILE %s is not a file of a mounted Secret (%v)", where, f, secretFiles)
			}
			switch c.Args[0] {
			case "worker":
				i := slices.Index(c.Args, "--type")
				if i < 0 || i+1 >= len(c.Args) || !types[c.Args[i+1]] {
					t.Errorf("%s: runs no type of the ConfigMap's workers.toml: %v", where, c.Args)
				} else {
					ran[c.Args[i+1]] = true
				}
				i = slices.Index(c.Args, "--config")
				if i < 0 || i+1 >= len(c.Args) || mounts[filepath.Dir(c.Args[i+1])] != "config" || filepath.Base(c.Args[i+1]) != "workers.toml" {
					t.Errorf("%s: --config is not the mounted ConfigMap's workers.toml: %v", where, c.Args)
				}
				if f := passwordFile(cm.Data["workers.toml"]); !secretFiles[f] {
					t.Errorf("%s: workers.toml's password_file %s is not a file of a mounted Secret (%v)", where, f, secretFiles)
				}
				if !pod.Spec.ShareProcessNamespace {
					t.Errorf("%s: shareProcessNamespace is off: the worker would be PID 1, and the processes an exec command leaves behind zombies", where)
				}
				grace := 30 * time.Second // Kubernetes' default
				if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
					grace = time.Duration(*g) * time.Second
				}
				if grace <= cfg.ShutdownTimeout {
					t.Errorf("%s: terminationGracePeriodSeconds %s must be above the shutdown_timeout %s", where, grace, cfg.ShutdownTimeout)
				}
				for _, p := range []struct {
					probe *probe
					path  string
				}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}} {
					if p.probe == nil || p.probe.HTTPGet.Path != p.path || !served(p.probe.HTTPGet.Path) {
						t.Errorf("%s: want a probe on %s, which the worker's health handler serves", where, p.path)
						continue
					}
					if port := c.port(p.probe.HTTPGet.Port); strconv.Itoa(port) != healthPort {
						t.Errorf("%s: the probe of %s is on port %d; the worker listens on %s (health_addr)", where, p.path, port, healthPort)
					}
				}
				if a := pod.Metadata.Annotations; a["prometheus.io/port"] != healthPort || a["prometheus.io/path"] != "/metrics" {
					t.Errorf("%s: scrape annotations %v, want port %s, path /metrics", where, a, healthPort)
				}
			case "serve":
				i := slices.Index(c.Args, "--addr")
				if i < 0 || i+1 >= len(c.Args) {
					t.Errorf("%s: serve without --addr listens on loopback, out of the kubelet's and Prometheus's reach", where)
					continue
				}
				_, port, err := net.SplitHostPort(c.Args[i+1])
				if err != nil || c.port(yaml.Node{Value: port}) == 0 {
					t.Errorf("%s: --addr %s: no such container port", where, c.Args[i+1])
				}
				for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
					if p == nil || strconv.Itoa(c.port(p.HTTPGet.Port)) != port || !strings.Contains(serveHelp, "\t"+p.HTTPGet.Path+" ") {
						t.Errorf("%s: want probes on paths serve serves, on port %s", where, port)
					}
				}
				if a := pod.Metadata.Annotations; a["prometheus.io/port"] != port {
					t.Errorf("%s: scrape annotations %v, want port %s", where, a, port)
				}
			}
		}
	}
	for typ := range types {
		if !ran[typ] {
			t.Errorf("workers.toml configures %s but no Deployment runs it", typ)
		}
	}

	// Services reach pods that exist, on ports they have.
	for _, s := range byKind["Service"] {
		var spec struct {
			Selector map[string]string `yaml:"selector"`
			Ports    []struct {
				TargetPort yaml.Node `yaml:"targetPort"`
			} `yaml:"ports"`
		}
		if err := s.Spec.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		matched := false
		for _, pod := range deployments {
			if !labelsMatch(spec.Selector, pod.Metadata.Labels) {
				continue
			}
			matched = true
			for _, p := range spec.Ports {
				if pod.Spec.Containers[0].port(p.TargetPort) == 0 {
					t.Errorf("Service %s: target port %s is not a port of its pods", s.Metadata.Name, p.TargetPort.Value)
				}
			}
		}
		if !matched {
			t.Errorf("Service %s selects no pods", s.Metadata.Name)
		}
	}

	// The autoscaler: a Deployment that exists, on a metric couchq exports
	// (prometheus-adapter's rule serves the same one).
	adapter := find("ConfigMap", "prometheus-adapter-couchq")
	for _, h := range byKind["HorizontalPodAutoscaler"] {
		var spec struct {
			ScaleTargetRef struct {
				Kind string `yaml:"kind"`
				Name string `yaml:"name"`
			} `yaml:"scaleTargetRef"`
			Metrics []struct {
				External *struct {
					Metric struct {
						Name     string `yaml:"name"`
						Selector struct {
							MatchLabels map[string]string `yaml:"matchLabels"`
						} `yaml:"selector"`
					} `yaml:"metric"`
				} `yaml:"external"`
			} `yaml:"metrics"`
		}
		if err := h.Spec.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		if spec.ScaleTargetRef.Kind != "Deployment" || find("Deployment", spec.ScaleTargetRef.Name) == nil {
			t.Errorf("HPA %s scales %s %s, which is not here", h.Metadata.Name, spec.ScaleTargetRef.Kind, spec.ScaleTargetRef.Name)
		}
		for _, m := range spec.Metrics {
			if m.External == nil {
				continue
			}
			name := m.External.Metric.Name
			if !metricExported(t, name) {
				t.Errorf("HPA %s: couchq exports no metric %s", h.Metadata.Name, name)
			}
			if typ := m.External.Metric.Selector.MatchLabels["type"]; !types[typ] {
				t.Errorf("HPA %s: type %q is not a type of workers.toml", h.Metadata.Name, typ)
			}
			if adapter == nil || !strings.Contains(adapter.Data["config.yaml"], "seriesQuery: '"+name+"{") {
				t.Errorf("HPA %s: prometheus-adapter.yaml has no rule for %s", h.Metadata.Name, name)
			}
		}
	}
	if len(byKind["HorizontalPodAutoscaler"]) == 0 {
		t.Error("no HorizontalPodAutoscaler")
	}
	if adapter != nil {
		var rules struct {
			ExternalRules []map[string]any `yaml:"externalRules"`
		}
		if err := yaml.Unmarshal([]byte(adapter.Data["config.yaml"]), &rules); err != nil || len(rules.ExternalRules) == 0 {
			t.Errorf("prometheus-adapter.yaml's config.yaml: %v %v", rules, err)
		}
	}

	// The PodMonitor selects couchq's pods, on ports they have.
	for _, pm := range byKind["PodMonitor"] {
		var spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Endpoints []struct {
				Port string `yaml:"port"`
			} `yaml:"podMetricsEndpoints"`
		}
		if err := pm.Spec.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		for _, e := range spec.Endpoints {
			found := false
			for _, pod := range deployments {
				if labelsMatch(spec.Selector.MatchLabels, pod.Metadata.Labels) && len(pod.Spec.Containers) > 0 &&
					pod.Spec.Containers[0].port(yaml.Node{Value: e.Port}) != 0 {
					found = true
				}
			}
			if !found {
				t.Errorf("PodMonitor %s: no selected pod has port %s", pm.Metadata.Name, e.Port)
			}
		}
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// metricExported reports whether couchq's source defines the metric: the
// queue's (opshttp, which couchq serve exports) or a worker process's.
func metricExported(t *testing.T, name string) bool {
	t.Helper()
	for _, f := range []string{"../opshttp/collector.go", "../worker/metrics.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), `"`+name+`"`) {
			return true
		}
	}
	return false
}
