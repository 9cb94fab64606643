package podenv

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "default", UID: "uid-1",
			Labels:      map[string]string{"app": "web", "tier": "front"},
			Annotations: map[string]string{"note": "say \"hi\"", "example.com/x": "1"},
		},
		Spec: corev1.PodSpec{
			NodeName:           "pi-17",
			ServiceAccountName: "builder",
			Containers: []corev1.Container{
				{Name: "app", Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
				}},
				{Name: "side"},
			},
		},
		Status: corev1.PodStatus{PodIP: "10.0.0.9", PodIPs: []corev1.PodIP{{IP: "10.0.0.9"}, {IP: "fd00::9"}}, HostIP: "192.168.1.5"},
	}
}

func testSources() Sources {
	cms := map[string]*corev1.ConfigMap{
		"app": {ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"},
			Data: map[string]string{"MODE": "prod", "LEVEL": "3", "1BAD=": "x", "dotted.key": "ok"}},
		"over": {ObjectMeta: metav1.ObjectMeta{Name: "over", Namespace: "default"}, Data: map[string]string{"DE": "over"}},
	}
	secrets := map[string]*corev1.Secret{
		"db": {ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"},
			Data: map[string][]byte{"password": []byte("s3cr=t\n"), "USER": []byte("admin")}},
	}
	return Sources{
		ConfigMap: func(ns, name string) (*corev1.ConfigMap, bool, error) {
			cm, ok := cms[name]
			if !ok || ns != "default" {
				return nil, false, nil
			}
			return cm, true, nil
		},
		Secret: func(ns, name string) (*corev1.Secret, bool, error) {
			s, ok := secrets[name]
			if !ok || ns != "default" {
				return nil, false, nil
			}
			return s, true, nil
		},
		PodIP:           "10.0.0.7",
		HostIP:          "192.168.1.2",
		NodeAllocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("2Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("10G")},
	}
}

func field(path string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
}

func res(container, name, divisor string) *corev1.EnvVarSource {
	s := &corev1.ResourceFieldSelector{ContainerName: container, Resource: name}
	if divisor != "" {
		s.Divisor = resource.MustParse(divisor)
	}
	return &corev1.EnvVarSource{ResourceFieldRef: s}
}

func cmKey(name, key string, optional bool) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: ptr(optional)}}
}

func secretKey(name, key string, optional bool) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: ptr(optional)}}
}

func TestEnv(t *testing.T) {
	tests := []struct {
		name      string
		container string // default "app"
		envFrom   []corev1.EnvFromSource
		env       []corev1.EnvVar
		src       func(*Sources)
		want      []string
		wantErr   string
		missing   *MissingError
	}{
		{
			name: "literal values keep declaration order",
			env:  []corev1.EnvVar{{Name: "B", Value: "2"}, {Name: "A", Value: "1"}, {Name: "EMPTY"}},
			want: []string{"B=2", "A=1", "EMPTY="},
		},
		{
			name: "later env entry overrides earlier one in place",
			env:  []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "A", Value: "3"}},
			want: []string{"A=3", "B=2"},
		},
		{
			name: "fieldRef metadata",
			env: []corev1.EnvVar{
				{Name: "NAME", ValueFrom: field("metadata.name")},
				{Name: "NS", ValueFrom: field("metadata.namespace")},
				{Name: "UID", ValueFrom: field("metadata.uid")},
				{Name: "APP", ValueFrom: field("metadata.labels['app']")},
				{Name: "NOLABEL", ValueFrom: field("metadata.labels['absent']")},
				{Name: "NOTE", ValueFrom: field("metadata.annotations['note']")},
				{Name: "LABELS", ValueFrom: field("metadata.labels")},
			},
			want: []string{"NAME=web", "NS=default", "UID=uid-1", "APP=web", "NOLABEL=", `NOTE=say "hi"`, "LABELS=app=\"web\"\ntier=\"front\""},
		},
		{
			name: "fieldRef spec and status from sources",
			env: []corev1.EnvVar{
				{Name: "NODE", ValueFrom: field("spec.nodeName")},
				{Name: "SA", ValueFrom: field("spec.serviceAccountName")},
				{Name: "PODIP", ValueFrom: field("status.podIP")},
				{Name: "PODIPS", ValueFrom: field("status.podIPs")},
				{Name: "HOSTIP", ValueFrom: field("status.hostIP")},
				{Name: "HOSTIPS", ValueFrom: field("status.hostIPs")},
			},
			want: []string{"NODE=pi-17", "SA=builder", "PODIP=10.0.0.7", "PODIPS=10.0.0.7", "HOSTIP=192.168.1.2", "HOSTIPS=192.168.1.2"},
		},
		{
			name: "fieldRef status falls back to pod status",
			src:  func(s *Sources) { s.PodIP, s.HostIP = "", "" },
			env: []corev1.EnvVar{
				{Name: "PODIP", ValueFrom: field("status.podIP")},
				{Name: "PODIPS", ValueFrom: field("status.podIPs")},
				{Name: "HOSTIP", ValueFrom: field("status.hostIP")},
			},
			want: []string{"PODIP=10.0.0.9", "PODIPS=10.0.0.9,fd00::9", "HOSTIP=192.168.1.5"},
		},
		{
			name:    "fieldRef unsupported path",
			env:     []corev1.EnvVar{{Name: "X", ValueFrom: field("spec.restartPolicy")}},
			wantErr: `pod default/web: container "app": env "X": fieldRef "spec.restartPolicy": unsupported field path`,
		},
		{
			name:    "fieldRef subscript on a plain field",
			env:     []corev1.EnvVar{{Name: "X", ValueFrom: field("metadata.name['a']")}},
			wantErr: `takes no subscript`,
		},
		{
			name:    "fieldRef invalid label key",
			env:     []corev1.EnvVar{{Name: "X", ValueFrom: field("metadata.labels['a b']")}},
			wantErr: `invalid key`,
		},
		{
			name: "resourceFieldRef with divisor, cpu rounded up",
			env: []corev1.EnvVar{
				{Name: "CPU", ValueFrom: res("", "limits.cpu", "")},
				{Name: "CPU_M", ValueFrom: res("", "limits.cpu", "1m")},
				{Name: "CPU_100M", ValueFrom: res("", "limits.cpu", "100m")},
				{Name: "MEM", ValueFrom: res("", "limits.memory", "")},
				{Name: "MEM_MI", ValueFrom: res("", "limits.memory", "1Mi")},
				{Name: "REQ_MEM_MI", ValueFrom: res("", "requests.memory", "1Mi")},
				{Name: "REQ_CPU_M", ValueFrom: res("", "requests.cpu", "1m")},
			},
			want: []string{"CPU=1", "CPU_M=250", "CPU_100M=3", "MEM=67108864", "MEM_MI=64", "REQ_MEM_MI=32", "REQ_CPU_M=250"},
		},
		{
			name:      "resourceFieldRef unset limits fall back to node allocatable",
			container: "side",
			env: []corev1.EnvVar{
				{Name: "CPU", ValueFrom: res("", "limits.cpu", "")},
				{Name: "MEM_GI", ValueFrom: res("", "limits.memory", "1Gi")},
				{Name: "EPH_G", ValueFrom: res("", "limits.ephemeral-storage", "1G")},
				{Name: "REQ_CPU", ValueFrom: res("", "requests.cpu", "")},
			},
			want: []string{"CPU=4", "MEM_GI=2", "EPH_G=10", "REQ_CPU=0"},
		},
		{
			name:      "resourceFieldRef of another container by name",
			container: "side",
			env:       []corev1.EnvVar{{Name: "APP_MEM", ValueFrom: res("app", "limits.memory", "1Mi")}},
			want:      []string{"APP_MEM=64"},
		},
		{
			name:    "resourceFieldRef unknown container",
			env:     []corev1.EnvVar{{Name: "X", ValueFrom: res("nope", "limits.cpu", "")}},
			wantErr: `env "X": resourceFieldRef "limits.cpu": container "nope" not found in pod`,
		},
		{
			name:    "resourceFieldRef unsupported resource",
			env:     []corev1.EnvVar{{Name: "X", ValueFrom: res("", "limits.gpu", "")}},
			wantErr: `resourceFieldRef "limits.gpu": unsupported resource`,
		},
		{
			name: "configMapKeyRef and secretKeyRef",
			env: []corev1.EnvVar{
				{Name: "MODE", ValueFrom: cmKey("app", "MODE", false)},
				{Name: "PW", ValueFrom: secretKey("db", "password", false)},
			},
			want: []string{"MODE=prod", "PW=s3cr=t\n"},
		},
		{
			name:    "missing configMap",
			env:     []corev1.EnvVar{{Name: "MODE", ValueFrom: cmKey("nope", "MODE", false)}},
			wantErr: `pod default/web: container "app": env "MODE": configMap "nope" not found`,
			missing: &MissingError{Pod: "default/web", Container: "app", Env: "MODE", Kind: KindConfigMap, Name: "nope"},
		},
		{
			name:    "missing configMap key",
			env:     []corev1.EnvVar{{Name: "MODE", ValueFrom: cmKey("app", "nokey", false)}},
			wantErr: `pod default/web: container "app": env "MODE": configMap "app": key "nokey" not found`,
			missing: &MissingError{Pod: "default/web", Container: "app", Env: "MODE", Kind: KindConfigMap, Name: "app", Key: "nokey"},
		},
		{
			name:    "missing secret",
			env:     []corev1.EnvVar{{Name: "PW", ValueFrom: secretKey("nope", "password", false)}},
			missing: &MissingError{Pod: "default/web", Container: "app", Env: "PW", Kind: KindSecret, Name: "nope"},
		},
		{
			name:    "missing secret key",
			env:     []corev1.EnvVar{{Name: "PW", ValueFrom: secretKey("db", "nokey", false)}},
			missing: &MissingError{Pod: "default/web", Container: "app", Env: "PW", Kind: KindSecret, Name: "db", Key: "nokey"},
		},
		{
			name: "optional refs that are missing leave the variable out",
			env: []corev1.EnvVar{
				{Name: "A", ValueFrom: cmKey("nope", "MODE", true)},
				{Name: "B", ValueFrom: cmKey("app", "nokey", true)},
				{Name: "C", ValueFrom: secretKey("nope", "x", true)},
				{Name: "D", ValueFrom: secretKey("db", "nokey", true)},
				{Name: "E", Value: "$(A)"},
			},
			want: []string{"E=$(A)"},
		},
		{
			name: "envFrom with prefix, invalid names skipped, env overrides",
			envFrom: []corev1.EnvFromSource{
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}},
				{Prefix: "DB_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}}},
			},
			env:  []corev1.EnvVar{{Name: "MODE", Value: "dev"}, {Name: "X", Value: "$(DB_USER)@$(MODE)"}},
			want: []string{"LEVEL=3", "MODE=dev", "dotted.key=ok", "DB_USER=admin", "DB_password=s3cr=t\n", "X=admin@dev"},
		},
		{
			name: "envFrom sources in order, a later source overrides in place",
			envFrom: []corev1.EnvFromSource{
				{Prefix: "MO", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}},
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}},
				{Prefix: "MO", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "over"}}},
			},
			want: []string{"MOLEVEL=3", "MOMODE=prod", "MOdotted.key=ok", "LEVEL=3", "MODE=over", "dotted.key=ok"},
		},
		{
			name: "envFrom missing optional source is skipped",
			envFrom: []corev1.EnvFromSource{
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Optional: ptr(true)}},
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Optional: ptr(true)}},
			},
			env:  []corev1.EnvVar{{Name: "A", Value: "1"}},
			want: []string{"A=1"},
		},
		{
			name: "envFrom missing source",
			envFrom: []corev1.EnvFromSource{
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}}},
			},
			wantErr: `pod default/web: container "app": envFrom: secret "nope" not found`,
			missing: &MissingError{Pod: "default/web", Container: "app", Kind: KindSecret, Name: "nope"},
		},
		{
			name: "expansion: earlier vars only, $$ escapes, unknown kept",
			env: []corev1.EnvVar{
				{Name: "A", Value: "a"},
				{Name: "B", Value: "$(A)-$(C)-$$(A)-$$$(A)-$A-$(-$"},
				{Name: "C", Value: "c"},
				{Name: "D", Value: "$(C)$(C)"},
			},
			want: []string{"A=a", "B=a-$(C)-$(A)-$a-$A-$(-$", "C=c", "D=cc"},
		},
		{
			name: "valueFrom values are not expanded",
			env: []corev1.EnvVar{
				{Name: "A", Value: "a"},
				{Name: "NOTE", ValueFrom: field("metadata.annotations['example.com/x']")},
				{Name: "SELF", Value: "$(SELF)x"},
			},
			want: []string{"A=a", "NOTE=1", "SELF=$(SELF)x"},
		},
		{
			name:    "invalid env name",
			env:     []corev1.EnvVar{{Name: "A=B", Value: "1"}},
			wantErr: `pod default/web: container "app": env[0]: invalid variable name "A=B"`,
		},
		{
			name:    "fileKeyRef is not supported",
			env:     []corev1.EnvVar{{Name: "F", ValueFrom: &corev1.EnvVarSource{FileKeyRef: &corev1.FileKeySelector{VolumeName: "v", Path: "p", Key: "k"}}}},
			wantErr: `valueFrom.fileKeyRef is not supported`,
		},
		{
			name:    "nil sources find nothing",
			src:     func(s *Sources) { s.ConfigMap, s.Secret = nil, nil },
			env:     []corev1.EnvVar{{Name: "MODE", ValueFrom: cmKey("app", "MODE", false)}},
			missing: &MissingError{Pod: "default/web", Container: "app", Env: "MODE", Kind: KindConfigMap, Name: "app"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod()
			name := tt.container
			if name == "" {
				name = "app"
			}
			c := findContainer(pod, name)
			c.EnvFrom, c.Env = tt.envFrom, tt.env
			src := testSources()
			if tt.src != nil {
				tt.src(&src)
			}
			got, err := Env(pod, c, src)
			if tt.wantErr != "" || tt.missing != nil {
				if err == nil {
					t.Fatalf("Env = %q, want error", got)
				}
				if tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q, want it to contain %q", err, tt.wantErr)
				}
				var me *MissingError
				if tt.missing != nil {
					if !errors.As(err, &me) {
						t.Fatalf("error %v (%T) is not a *MissingError", err, err)
					}
					if *me != *tt.missing {
						t.Errorf("MissingError = %+v, want %+v", *me, *tt.missing)
					}
				} else if errors.As(err, &me) {
					t.Errorf("error %v is a *MissingError, want another error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Env =\n  %q\nwant\n  %q", got, tt.want)
			}
		})
	}
}

func TestEnvReadsEachObjectOnce(t *testing.T) {
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}}
	c.Env = []corev1.EnvVar{{Name: "A", ValueFrom: cmKey("app", "MODE", false)}, {Name: "B", ValueFrom: cmKey("app", "LEVEL", false)}, {Name: "C", ValueFrom: cmKey("gone", "x", true)}, {Name: "D", ValueFrom: cmKey("gone", "x", true)}}
	src := testSources()
	calls := map[string]int{}
	get := src.ConfigMap
	src.ConfigMap = func(ns, name string) (*corev1.ConfigMap, bool, error) {
		calls[name]++
		return get(ns, name)
	}
	if _, err := Env(pod, c, src); err != nil {
		t.Fatal(err)
	}
	if calls["app"] != 1 || calls["gone"] != 1 {
		t.Errorf("lookups = %v, want one per object", calls)
	}
}

func TestEnvSourceErrorIsNotMissing(t *testing.T) {
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.Env = []corev1.EnvVar{{Name: "A", ValueFrom: cmKey("app", "MODE", true)}}
	src := testSources()
	src.ConfigMap = func(string, string) (*corev1.ConfigMap, bool, error) { return nil, false, errors.New("disk on fire") }
	_, err := Env(pod, c, src)
	var me *MissingError
	if err == nil || errors.As(err, &me) || !strings.Contains(err.Error(), `get configMap "app": disk on fire`) {
		t.Fatalf("err = %v, want the store's error, even for an optional ref", err)
	}
}

func TestStoreSources(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"}, Data: map[string]string{"MODE": "prod"}}
	if err := st.ConfigMaps().Put(store.SourceAPI, cm); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"}, Data: map[string][]byte{"pw": []byte("x")}, StringData: map[string]string{"user": "u"}}
	if err := st.Secrets().Put(store.SourceAPI, sec); err != nil {
		t.Fatal(err)
	}
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.Env = []corev1.EnvVar{
		{Name: "MODE", ValueFrom: cmKey("app", "MODE", false)},
		{Name: "PW", ValueFrom: secretKey("db", "pw", false)},
		{Name: "USER", ValueFrom: secretKey("db", "user", false)},
		{Name: "OPT", ValueFrom: cmKey("other", "x", true)},
	}
	got, err := Env(pod, c, StoreSources(st))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"MODE=prod", "PW=x", "USER=u"}; !slices.Equal(got, want) {
		t.Errorf("Env = %q, want %q", got, want)
	}
	c.Env = []corev1.EnvVar{{Name: "X", ValueFrom: secretKey("other", "x", false)}}
	var me *MissingError
	if _, err := Env(pod, c, StoreSources(st)); !errors.As(err, &me) || me.Name != "other" {
		t.Fatalf("err = %v, want MissingError for secret other", err)
	}
}

func TestServiceEnvAsKubeletMakesIt(t *testing.T) {
	svc := func(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: ports}}
	}
	svcs := map[string][]*corev1.Service{
		"default": {svc("default", "kubernetes", "10.43.0.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}),
			svc("default", "other", "10.43.0.9", corev1.ServicePort{Port: 1})},
		"web": {svc("web", "foo-service", "10.43.0.20", corev1.ServicePort{Port: 8765, Protocol: corev1.ProtocolTCP}),
			svc("web", "headless", corev1.ClusterIPNone, corev1.ServicePort{Port: 80})},
	}
	src := Sources{Services: func(ns string) ([]*corev1.Service, error) { return svcs[ns], nil }}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "p"}}
	c := &corev1.Container{Name: "c", Env: []corev1.EnvVar{
		{Name: "URL", Value: "http://$(FOO_SERVICE_SERVICE_HOST):$(FOO_SERVICE_SERVICE_PORT)"},
		{Name: "KUBERNETES_SERVICE_PORT", Value: "mine"},
	}}
	env, err := Env(pod, c, src)
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(env)
	for k, v := range map[string]string{
		"URL":                             "http://10.43.0.20:8765",
		"KUBERNETES_SERVICE_PORT":         "mine", // the container's own wins
		"KUBERNETES_SERVICE_HOST":         "10.43.0.1",
		"KUBERNETES_SERVICE_PORT_HTTPS":   "443",
		"KUBERNETES_PORT":                 "tcp://10.43.0.1:443",
		"FOO_SERVICE_SERVICE_HOST":        "10.43.0.20",
		"FOO_SERVICE_SERVICE_PORT":        "8765",
		"FOO_SERVICE_PORT":                "tcp://10.43.0.20:8765",
		"FOO_SERVICE_PORT_8765_TCP":       "tcp://10.43.0.20:8765",
		"FOO_SERVICE_PORT_8765_TCP_PROTO": "tcp",
		"FOO_SERVICE_PORT_8765_TCP_PORT":  "8765",
		"FOO_SERVICE_PORT_8765_TCP_ADDR":  "10.43.0.20",
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"OTHER_SERVICE_HOST", "HEADLESS_SERVICE_HOST"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s set: another namespace's service, or a headless one", k)
		}
	}
	if env[0] != "URL=http://10.43.0.20:8765" {
		t.Errorf("the container's own variables do not come first: %q", env)
	}

	off := false
	pod.Spec.EnableServiceLinks = &off
	env, err = Env(pod, &corev1.Container{Name: "c"}, src)
	if err != nil {
		t.Fatal(err)
	}
	got = envMap(env)
	if _, ok := got["FOO_SERVICE_SERVICE_HOST"]; ok || got["KUBERNETES_SERVICE_HOST"] != "10.43.0.1" {
		t.Errorf("enableServiceLinks false: %q, want only the kubernetes service's", env)
	}
}
