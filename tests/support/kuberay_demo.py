"""A manifest in the shape of KubeRay's agent-sandbox demo, for the unit and compat tiers alike."""

DEMO = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python-runtime-sandbox}
spec:
  envVarsInjectionPolicy: Disallowed
  networkPolicyManagement: Unmanaged
  podTemplate:
    metadata:
      labels: {app: python-runtime-pool}
    spec:
      automountServiceAccountToken: false
      runtimeClassName: gvisor
      containers:
      - name: runtime
        image: registry.example.com/agent-sandbox/python-runtime-sandbox:v0.4.6
        imagePullPolicy: Always
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python-runtime-pool}
spec:
  replicas: 2
  sandboxTemplateRef: {name: python-runtime-sandbox}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: python-runtime-pool-restrict-egress}
spec:
  podSelector:
    matchLabels: {app: python-runtime-pool}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector:
        matchLabels: {kubernetes.io/metadata.name: kube-system}
      podSelector:
        matchLabels: {k8s-app: kube-dns}
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
  - to: [{ipBlock: {cidr: 169.254.20.10/32}}]
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
"""
"""A manifest in the shape of KubeRay's agent-sandbox demo: an unmanaged template whose egress a NetworkPolicy of
the same file restricts to name resolution, gVisor, and a registry image."""
