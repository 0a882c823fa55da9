//! The queries of an FP8 run are embedded by the function its documents were: FP8 projections,
//! on the CPU by the library's emulation of the GPU's arithmetic.

use embedfleet_core::Precision;
use embedfleet_embed::{LoadedModels, ModelLoad};
use embedfleet_models::DeviceSpec;
use embedfleet_query::QueryModel;

const INSTRUCTION: &str = "Given a topic, retrieve papers about it";

fn terms() -> Vec<String> {
    [
        "graph neural networks",
        "a",
        "protein folding with attention over long contexts",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn an_fp8_runs_queries_go_through_fp8_projections_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let query = |precision| {
        QueryModel::new(dir.path().to_path_buf(), vec![DeviceSpec::Cpu], None)
            .with_precision(precision)
            .embed(INSTRUCTION, &terms())
            .unwrap()
    };
    let (native, fp8) = (query(Precision::Native), query(Precision::Fp8));
    // The documents' function: the same model loaded with FP8 projections.
    let how = ModelLoad {
        precision: Precision::Fp8,
        fp8_emulated_on_cpu: true,
        ..Default::default()
    };
    let documents_model = LoadedModels::load_with(dir.path(), &[DeviceSpec::Cpu], &how).unwrap();
    assert!(documents_model.models[0].fp8_projections());
    let want = documents_model
        .embed_queries(INSTRUCTION, &terms(), 32_768)
        .unwrap();
    let cosine = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    for ((f, w), n) in fp8.iter().zip(&want).zip(&native) {
        assert_eq!(f, w, "the FP8 query is the FP8 model's");
        let c = cosine(f, n);
        assert!(c < 0.99999 && c > 0.99, "FP8 against native: cosine {c}");
    }
}
